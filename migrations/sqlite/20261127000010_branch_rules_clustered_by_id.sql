-- no-transaction
-- Branch rules stored in id order (issue 15, the write path).
--
-- branch_rules was a rowid table: its rows lay in insertion order, and its
-- ids (random UUIDs) had an index of their own. A burst claims and releases
-- its rules in (due time, id) order, so every rule of a batch sat on a
-- different page of the table: each commit wrote one page per rule twice
-- (claim, release), and each lookup went through the id index first. As a
-- WITHOUT ROWID table the rows are kept in id order, the rules of one batch
-- share pages, and the primary key is the table itself. Drains of 20,000
-- jobs ran about a third faster with 10 and with 50 workers, and of
-- 100,000 jobs over half faster (BENCHMARKS.md, "Branch rules in id
-- order").
--
-- SQLite cannot change a table's storage in place, so the table is rebuilt
-- by SQLite's "making other kinds of table schema changes" procedure.
-- action_details and executions reference branch_rules with ON DELETE
-- CASCADE: with foreign keys on, dropping the old table would delete every
-- action and the whole history. So this file runs outside sqlx's
-- transaction (the first line says so), switches foreign keys off, which
-- SQLite allows only outside a transaction, and does the rebuild in a
-- transaction of its own: a crash inside it leaves the old table whole.
-- A failed statement fails the start, and the process takes the
-- connection, still inside that transaction, with it. Every row is
-- copied, so no reference changes. Run twice (a crash after
-- the COMMIT, before sqlx records the migration), it rebuilds the same
-- table again.
PRAGMA foreign_keys = OFF;

BEGIN IMMEDIATE;

DROP TABLE IF EXISTS branch_rules_new;

-- The columns in the order the earlier migrations left them (..01, then
-- created_by and updated_by from ..07, then policy, retry_of and
-- failed_attempts from ..09).
CREATE TABLE branch_rules_new (
    id                   TEXT    NOT NULL PRIMARY KEY,
    branch_id            TEXT    NOT NULL REFERENCES branches (id) ON DELETE CASCADE,
    rule_id              TEXT    NOT NULL REFERENCES rules (id) ON DELETE CASCADE,
    brand_rule_id        TEXT    NULL REFERENCES brand_rules (id) ON DELETE SET NULL,
    is_active            INTEGER NOT NULL DEFAULT 1 CHECK (is_active IN (0, 1)),
    is_archived          INTEGER NOT NULL DEFAULT 0 CHECK (is_archived IN (0, 1)),
    is_force_stopped     INTEGER NOT NULL DEFAULT 0 CHECK (is_force_stopped IN (0, 1)),
    is_currently_running INTEGER NOT NULL DEFAULT 0 CHECK (is_currently_running IN (0, 1)),
    operation_time_from  TEXT    NULL,
    operation_time_to    TEXT    NULL,
    next_run_time        INTEGER NULL,
    last_run_time        INTEGER NULL,
    lock_holder          TEXT    NULL,
    lock_time            INTEGER NULL,
    lock_epoch           INTEGER NOT NULL DEFAULT 0,
    params               TEXT    NOT NULL DEFAULT '{}',
    created_at           INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    updated_at           INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    created_by           TEXT    NULL,
    updated_by           TEXT    NULL,
    policy               TEXT    NULL,
    retry_of             INTEGER NULL,
    failed_attempts      INTEGER NOT NULL DEFAULT 0
) STRICT, WITHOUT ROWID;

INSERT INTO branch_rules_new (id, branch_id, rule_id, brand_rule_id, is_active, is_archived,
    is_force_stopped, is_currently_running, operation_time_from, operation_time_to,
    next_run_time, last_run_time, lock_holder, lock_time, lock_epoch, params, created_at,
    updated_at, created_by, updated_by, policy, retry_of, failed_attempts)
SELECT id, branch_id, rule_id, brand_rule_id, is_active, is_archived,
    is_force_stopped, is_currently_running, operation_time_from, operation_time_to,
    next_run_time, last_run_time, lock_holder, lock_time, lock_epoch, params, created_at,
    updated_at, created_by, updated_by, policy, retry_of, failed_attempts
FROM branch_rules;

-- With foreign keys off this deletes nothing else: the references in
-- action_details and executions name the table, and after the rename they
-- name the new one.
DROP TABLE branch_rules;
ALTER TABLE branch_rules_new RENAME TO branch_rules;

-- Every index and trigger the earlier migrations left on branch_rules
-- (..01, ..02 and ..03).
CREATE INDEX branch_rules_next_run_time_idx ON branch_rules (next_run_time);
CREATE INDEX branch_rules_branch_id_idx ON branch_rules (branch_id);
CREATE INDEX branch_rules_rule_id_idx ON branch_rules (rule_id);
CREATE INDEX branch_rules_brand_rule_id_idx ON branch_rules (brand_rule_id);
CREATE INDEX branch_rules_updated_at_idx ON branch_rules (updated_at);
CREATE INDEX branch_rules_lock_holder_idx ON branch_rules (lock_holder)
    WHERE lock_holder IS NOT NULL;

CREATE TRIGGER branch_rules_touch_updated_at
AFTER UPDATE ON branch_rules
FOR EACH ROW WHEN NEW.updated_at = OLD.updated_at
BEGIN
    UPDATE branch_rules
    SET updated_at = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
    WHERE id = NEW.id;
END;

COMMIT;

PRAGMA foreign_keys = ON;
