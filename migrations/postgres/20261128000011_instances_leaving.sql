-- A graceful stop hands its partitions back at the start of its drain, not
-- at the end: while its running jobs finish (up to SHUTDOWN_GRACE_SECONDS)
-- it keeps heartbeating, so its peers must not call it silent, yet they
-- must stop dealing it a share. `leaving_at` says so; the fair share counts
-- only live instances that are not leaving. A new start of the instance
-- clears it.
ALTER TABLE instances ADD COLUMN leaving_at BIGINT NULL;
