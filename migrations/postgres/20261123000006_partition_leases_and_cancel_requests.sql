-- Several instances on one database (DESIGN §4, seed 003's distributed lock).
--
-- partition_leases: one row per partition (0 .. PARTITION_COUNT - 1), made
-- on first use. An instance claims the rules of a partition only while it
-- holds the partition's lease: holder = its INSTANCE_ID and expires_at (epoch
-- ms on the database's own clock) still ahead. epoch grows with every new
-- holder, so a log line or a test can tell one tenure from the next.
CREATE TABLE partition_leases (
    partition   BIGINT NOT NULL PRIMARY KEY,
    holder      TEXT    NULL,
    epoch       BIGINT NOT NULL DEFAULT 0,
    expires_at  BIGINT NOT NULL DEFAULT 0
);

-- Cancel through any instance: the API records the request here and the
-- instance that owns the execution acts on it at its next lease renewal.
ALTER TABLE executions ADD COLUMN cancel_requested_at BIGINT NULL;
