-- wrk: PUT with fencing token 1 to /spread/0 .. /spread/63 in turn. Holders of 64
-- different resources, whose mark reads can only be batched across resources.
wrk.method = "PUT"
wrk.body = "x"
wrk.headers["fencing-token"] = "1"
local n = 0
request = function()
  n = n + 1
  return wrk.format(nil, "/spread/" .. (n % 64))
end
