-- Incremental plan refresh reads only branch rules changed since its last
-- read, by updated_at. An UPDATE that leaves updated_at alone (operator SQL)
-- still has to be seen, so the database bumps it.
CREATE INDEX branch_rules_updated_at_idx ON branch_rules (updated_at);

CREATE TRIGGER branch_rules_touch_updated_at
AFTER UPDATE ON branch_rules
FOR EACH ROW WHEN NEW.updated_at = OLD.updated_at
BEGIN
    UPDATE branch_rules
    SET updated_at = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
    WHERE id = NEW.id;
END;
