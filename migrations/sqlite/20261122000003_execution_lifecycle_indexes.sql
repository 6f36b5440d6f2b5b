-- Indexes for the execution lifecycle (claims, recovery, listing).

-- list_executions pages by the keyset (requested_at, id).
CREATE INDEX executions_requested_at_id_idx ON executions (requested_at, id);

-- Recovery and stale_owners look for an owner's unfinished executions; the
-- partial index stays as small as the work in flight, however long the
-- history grows.
CREATE INDEX executions_open_owner_idx ON executions (owner)
    WHERE status IN ('requested', 'scheduled', 'running');

-- Recovery releases, and stale_owners looks for, the locks of one holder;
-- almost every row is unlocked, so only locked ones are indexed.
CREATE INDEX branch_rules_lock_holder_idx ON branch_rules (lock_holder)
    WHERE lock_holder IS NOT NULL;
