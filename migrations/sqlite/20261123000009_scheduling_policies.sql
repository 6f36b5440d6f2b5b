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
-- failed_attempts counts its failed attempts against max_attempts.
ALTER TABLE rules ADD COLUMN policy TEXT NULL;
ALTER TABLE branch_rules ADD COLUMN policy TEXT NULL;
ALTER TABLE branch_rules ADD COLUMN retry_of INTEGER NULL;
ALTER TABLE branch_rules ADD COLUMN failed_attempts INTEGER NOT NULL DEFAULT 0;

-- An occurrence a policy did not run is recorded as an execution with the
-- new terminal status `skipped` (finished_at set, so it is never open).
-- SQLite cannot change a CHECK constraint in place, so executions is
-- rebuilt, following SQLite's "making other kinds of table schema changes"
-- procedure as far as a migration allows. sqlx runs this file in one
-- transaction, where `PRAGMA foreign_keys` cannot be switched off; that is
-- safe here because no table references executions (its only foreign key
-- points at branch_rules), so dropping it cascades nowhere, and copying the
-- rows checks each one's branch rule as it goes. The column order is the
-- old one (cancel_requested_at last, where migration ..06 added it).
CREATE TABLE executions_new (
    id             TEXT    NOT NULL PRIMARY KEY,
    branch_rule_id TEXT    NOT NULL REFERENCES branch_rules (id) ON DELETE CASCADE,
    scheduled_for  INTEGER NOT NULL,
    status         TEXT    NOT NULL DEFAULT 'requested' CHECK (status IN
                       ('requested', 'scheduled', 'running', 'completed', 'failed', 'cancelled',
                        'timed_out', 'skipped')),
    attempt        INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    owner          TEXT    NULL,
    lock_epoch     INTEGER NOT NULL DEFAULT 0,
    requested_at   INTEGER NOT NULL,
    scheduled_at   INTEGER NULL,
    started_at     INTEGER NULL,
    finished_at    INTEGER NULL,
    error          TEXT    NULL,
    output         TEXT    NULL,
    created_at     INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    updated_at     INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    cancel_requested_at INTEGER NULL,
    CONSTRAINT executions_occurrence_key UNIQUE (branch_rule_id, scheduled_for, attempt)
) STRICT;

INSERT INTO executions_new (
    id, branch_rule_id, scheduled_for, status, attempt, owner, lock_epoch,
    requested_at, scheduled_at, started_at, finished_at, error, output,
    created_at, updated_at, cancel_requested_at)
SELECT
    id, branch_rule_id, scheduled_for, status, attempt, owner, lock_epoch,
    requested_at, scheduled_at, started_at, finished_at, error, output,
    created_at, updated_at, cancel_requested_at
FROM executions;

DROP TABLE executions;
ALTER TABLE executions_new RENAME TO executions;

-- Every index the earlier migrations left on executions (..03 and ..05;
-- ..04 and ..05 dropped the others). There are no triggers or views on it.
CREATE INDEX executions_requested_at_id_idx ON executions (requested_at, id);
CREATE INDEX executions_open_idx ON executions (requested_at, id, owner)
    WHERE finished_at IS NULL;
CREATE INDEX executions_finished_status_idx ON executions (status, requested_at, id)
    WHERE finished_at IS NOT NULL;
