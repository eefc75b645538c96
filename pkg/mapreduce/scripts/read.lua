-- read returns a run's record for a reader that bounds what it reads: the
-- fields it names, the sizes of the run's arguments and result, and each
-- of those two only when it is at most ARGV[1] bytes. One call, so that
-- the sizes and the values agree.
-- KEYS[1] run  HASH  the run record
-- ARGV[1] the most bytes of the arguments, and of the result, to return
-- ARGV[2..] the fields to return (the run's summary)
-- Returns false if the run does not exist, else {values of ARGV[2..] (false
-- for a field not set), args size, result size (-1 if the run has none),
-- args or false, result or false}.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local fields = {}
for i = 2, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local upto = tonumber(ARGV[1])
local args_size = redis.call('HSTRLEN', KEYS[1], 'args')
local result_size = -1
if redis.call('HEXISTS', KEYS[1], 'result') == 1 then
  result_size = redis.call('HSTRLEN', KEYS[1], 'result')
end
local args, result = false, false
if args_size <= upto then
  args = redis.call('HGET', KEYS[1], 'args') or false
end
if result_size >= 0 and result_size <= upto then
  result = redis.call('HGET', KEYS[1], 'result')
end
return {redis.call('HMGET', KEYS[1], unpack(fields)), args_size, result_size, args, result}
