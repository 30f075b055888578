-- lease.lua: apply a plan of the lease's holder (lifecycle.plan_renew, plan_checkpoint,
-- plan_hand_on, plan_fenced, plan_release: store.py's _as_holder packs it), if the call is in
-- the state the plan was made for (a compare-and-set); else write nothing.
--
-- KEYS and ARGV[1]: the call keys and the call id (_lib.lua).
-- ARGV[2] the state the plan was made for: 'holds' (the lease with token ARGV[3] is live and
--   holds the call), 'known' (the call is known: its spec exists), or '' (any state)
-- ARGV[3] the lease's token
-- ARGV[4...] the plan's writes (_lib.lua's apply): 'renew', 'checkpoint', 'hand_on', 'event',
--   'let_go'.
-- Checks, and nothing else: the state in ARGV[2].
-- Touches: what the writes touch.
-- Returns 1: the writes are applied; 0: the call is not in that state, and nothing was written.

local expect = ARGV[2]
if (expect == 'holds' and not holds(ARGV[3])) or (expect == 'known' and redis.call('EXISTS', SPEC) == 0) then
  return 0
end
local now, at = clock()
apply(4, now, at, {})
return 1
