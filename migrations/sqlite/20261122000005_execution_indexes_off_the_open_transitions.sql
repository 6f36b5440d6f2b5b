-- Requested → Scheduled → Running changes only status and a timestamp, and
-- at thousands of jobs a second these two transitions were a quarter of the
-- writer's time, mostly spent moving entries of two indexes:
-- - executions_status_idx held every row by status, so each transition
--   moved its entry;
-- - executions_open_owner_idx was partial on the status, so each transition
--   re-evaluated and rewrote its entry.
-- An execution is open exactly while finished_at is NULL (every terminal
-- write sets it), so both indexes now key on that instead. Neither changes
-- between open states: the open one keeps its entry from claim to finish,
-- and the finished one gets one entry, at the finish.

-- The work in flight, in listing order. It stays as small as that work
-- however long the history grows, so recovery and stale_owners scan it for
-- an owner, and listing an open status pages along it instead of along
-- the whole history.
DROP INDEX IF EXISTS executions_open_owner_idx;
CREATE INDEX executions_open_idx ON executions (requested_at, id, owner)
    WHERE finished_at IS NULL;

-- Listing finished executions by status pages along (requested_at, id).
DROP INDEX IF EXISTS executions_status_idx;
CREATE INDEX executions_finished_status_idx ON executions (status, requested_at, id)
    WHERE finished_at IS NOT NULL;
