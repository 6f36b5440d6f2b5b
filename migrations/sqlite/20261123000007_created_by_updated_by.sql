-- Who changed it (seed 001's f_creator / f_updater, issue 12): the name of
-- the API token (API_TOKENS `name:token`, or `api` for API_TOKEN) that
-- created a catalog row and that last changed it. NULL for rows written
-- before this column existed or outside the API (demo data, operator SQL).
-- At most 40 characters, as in the seed; the API enforces it at start-up.
ALTER TABLE brands ADD COLUMN created_by TEXT NULL;
ALTER TABLE brands ADD COLUMN updated_by TEXT NULL;
ALTER TABLE branches ADD COLUMN created_by TEXT NULL;
ALTER TABLE branches ADD COLUMN updated_by TEXT NULL;
ALTER TABLE rules ADD COLUMN created_by TEXT NULL;
ALTER TABLE rules ADD COLUMN updated_by TEXT NULL;
ALTER TABLE brand_rules ADD COLUMN created_by TEXT NULL;
ALTER TABLE brand_rules ADD COLUMN updated_by TEXT NULL;
ALTER TABLE action_templates ADD COLUMN created_by TEXT NULL;
ALTER TABLE action_templates ADD COLUMN updated_by TEXT NULL;
ALTER TABLE branch_rules ADD COLUMN created_by TEXT NULL;
ALTER TABLE branch_rules ADD COLUMN updated_by TEXT NULL;
ALTER TABLE action_details ADD COLUMN created_by TEXT NULL;
ALTER TABLE action_details ADD COLUMN updated_by TEXT NULL;
