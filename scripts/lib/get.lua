-- wrk: GET the URL's path, an unfenced read.
wrk.method = "GET"
