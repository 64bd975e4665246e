-- wrk: PUT to the URL's path with a token one higher each request: every admit
-- raises the mark. Starts above every token an earlier run sent (runs are seconds
-- apart, and one run sends far fewer than 100000 requests a second). Give each run a
-- path of its own: the writes wrk abandons when it stops are given up on, and hold
-- their resource at the ordering gate for the store apply bound.
local n = os.time() * 100000
request = function()
  n = n + 1
  return wrk.format("PUT", wrk.path, { ["fencing-token"] = string.format("%.0f", n) }, "x")
end
