-- wrk script for bench/throughput.py: the benchmark's request mix, one typical chat request
-- that ICE only annotates (pass). `wrk ... URL -- direct` adds `x-bench-route: direct`, which
-- envoy/bench.yaml routes to the same upstream with ext_proc disabled (the baseline).
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.body = '{"model":"m","messages":[{"role":"system","content":"You are helpful."},'
  .. '{"role":"user","content":"I am planning a week-long trip to Portugal in late spring '
  .. 'with two friends who enjoy hiking, seafood and old towns. Could you suggest a '
  .. 'day-by-day itinerary that starts in Lisbon and ends in Porto, with one or two easy '
  .. 'coastal walks, a few good places to eat, and tips on trains between cities? Please '
  .. 'keep it practical."}],"max_tokens":256,"temperature":0.7}'

function init(args)
  if args[1] == "direct" then
    wrk.headers["x-bench-route"] = "direct"
  end
end
