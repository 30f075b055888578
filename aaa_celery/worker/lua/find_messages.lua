-- find_messages.lua: where kombu's Redis transport holds the messages of some tasks.
--
-- KEYS[1] kombu's unacked hash (delivery tag -> JSON [message, exchange, routing key]):
--         messages a worker took and has not acked yet (acks_late: until the task ends).
-- KEYS[2..] the queue lists to look in (each queue with its priority lists).
-- ARGV[1] the most messages to read from one list (its oldest)     ARGV[2..] task ids.
-- Reads only; touches nothing.
-- Returns, per task id in ARGV[2..] order: 2 when a message of the task waits in a queue,
-- 1 when a worker took it (unacked), 0 when the broker has it nowhere, -1 when a list was
-- longer than ARGV[1] and not read whole (the answer is then unknown for the tasks not found).

local want = {}
for i = 2, #ARGV do
  want[ARGV[i]] = 0
end

-- The task id of a message (Celery's message protocol 2: headers.id), or nil.
local function task_id(message)
  if type(message) == 'table' and type(message.headers) == 'table' then
    return message.headers.id
  end
  return nil
end

local function decoded(raw)
  local ok, value = pcall(cjson.decode, raw)
  if ok then
    return value
  end
  return nil
end

local limit = tonumber(ARGV[1])
local whole = true
for k = 2, #KEYS do
  if redis.call('LLEN', KEYS[k]) > limit then
    whole = false
  end
  -- the oldest end (kombu pushes on the left and pops on the right): where calls old
  -- enough to be looked for wait
  for _, raw in ipairs(redis.call('LRANGE', KEYS[k], -limit, -1)) do
    local id = task_id(decoded(raw))
    if id and want[id] then
      want[id] = 2
    end
  end
end
for _, raw in ipairs(redis.call('HVALS', KEYS[1])) do
  local entry = decoded(raw)
  local id = type(entry) == 'table' and task_id(entry[1]) or nil
  if id and want[id] == 0 then
    want[id] = 1
  end
end

local found = {}
for i = 2, #ARGV do
  local where = want[ARGV[i]]
  if where == 0 and not whole then
    where = -1
  end
  found[#found + 1] = where
end
return found
