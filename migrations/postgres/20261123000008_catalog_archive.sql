-- History is kept (issue 12): a brand, branch or rule with executions is
-- archived instead of deleted (`?cascade=archive`), since deleting it would
-- cascade to its branch rules and their executions. archived_at (epoch ms)
-- marks it; listings hide it, its branch rules carry is_archived, and a get
-- by id still shows it with the time it was archived.
ALTER TABLE brands ADD COLUMN archived_at BIGINT NULL;
ALTER TABLE branches ADD COLUMN archived_at BIGINT NULL;
ALTER TABLE rules ADD COLUMN archived_at BIGINT NULL;
