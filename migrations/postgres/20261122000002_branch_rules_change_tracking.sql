-- Incremental plan refresh reads only branch rules changed since its last
-- read, by updated_at. An UPDATE that leaves updated_at alone (operator SQL)
-- still has to be seen, so the database bumps it.
CREATE INDEX branch_rules_updated_at_idx ON branch_rules (updated_at);

CREATE FUNCTION ruled_touch_updated_at() RETURNS trigger AS $$
BEGIN
    IF NEW.updated_at = OLD.updated_at THEN
        NEW.updated_at := (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT;
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER branch_rules_touch_updated_at
BEFORE UPDATE ON branch_rules
FOR EACH ROW EXECUTE FUNCTION ruled_touch_updated_at();
