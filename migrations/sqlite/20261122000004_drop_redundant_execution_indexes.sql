-- Every index is written on each lifecycle transition, and these two serve
-- no query the others do not:
-- - (branch_rule_id, scheduled_for) is a prefix of the occurrence key's
--   unique index, which serves the same lookups;
-- - every query by owner also asks for an open status, which the partial
--   executions_open_owner_idx serves, and it stays small.
DROP INDEX IF EXISTS executions_branch_rule_scheduled_idx;
DROP INDEX IF EXISTS executions_owner_idx;
