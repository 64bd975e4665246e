-- wrk: PUT a 1-byte body to the URL's path with fencing token 1, every request the
-- same. The current holder writing again: after the first write its mark is 1 and
-- each write is admitted without raising it.
wrk.method = "PUT"
wrk.body = "x"
wrk.headers["fencing-token"] = "1"
