-- Scheduling policies (issue 13).
--
-- rules.policy and branch_rules.policy: the policy object as JSON text
-- (misfire, catch-up, overlap, retries, jitter); NULL is no policy, and a
-- branch rule's fields override its rule's. A text the model refuses
-- quarantines the row (reason `policy`) instead of stopping a refresh.
--
-- branch_rules.retry_of / failed_attempts: engine state for a pending
-- retry. retry_of is the occurrence being retried (the next claim's
-- scheduled_for, so every attempt of it shares the occurrence key);
-- failed_attempts counts its failed attempts against max_attempts
-- (INTEGER: i32 in the model, like action_details.position).
ALTER TABLE rules ADD COLUMN policy TEXT NULL;
ALTER TABLE branch_rules ADD COLUMN policy TEXT NULL;
ALTER TABLE branch_rules ADD COLUMN retry_of BIGINT NULL;
ALTER TABLE branch_rules ADD COLUMN failed_attempts INTEGER NOT NULL DEFAULT 0;

-- An occurrence a policy did not run is recorded as an execution with the
-- new terminal status `skipped` (finished_at set, so it is never open).
-- executions_status_check is the name PostgreSQL gave the column's CHECK
-- in the initial migration. The new list holds the old one, so every
-- existing row passes the check the re-added constraint makes.
ALTER TABLE executions DROP CONSTRAINT executions_status_check;
ALTER TABLE executions ADD CONSTRAINT executions_status_check CHECK (status IN
    ('requested', 'scheduled', 'running', 'completed', 'failed', 'cancelled',
     'timed_out', 'skipped'));
