-- An append advances its run's last_seq, bytes and seen_at, and only
-- those (the record's copies are no longer written: reads take the
-- columns). Indexed, seen_at made every append insert an entry into each
-- of the run's six indexes; unindexed, PostgreSQL updates the row in
-- place (HOT), given room in its page. Lists still come newest first:
-- the runs an index selects (an agent's, a company's, the unfinished)
-- are sorted after.
DROP INDEX {schema}.runs_seen_at;
DROP INDEX {schema}.runs_agent;
DROP INDEX {schema}.runs_company;
DROP INDEX {schema}.runs_unfinished;
CREATE INDEX runs_agent ON {schema}.runs (agent);
CREATE INDEX runs_company ON {schema}.runs (company);
CREATE INDEX runs_unfinished ON {schema}.runs (id) WHERE NOT done;
ALTER TABLE {schema}.runs SET (fillfactor = 50);
-- A relay from before this migration, still running in a rolling
-- upgrade, reads the counters from the record and writes them back with
-- its every update of the run: a last_seq set back would have this
-- version's next append number lines that exist, and fail for good. A
-- run's last_seq never goes back.
CREATE FUNCTION {schema}.runs_keep_last_seq() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.last_seq := OLD.last_seq;
    RETURN NEW;
END
$$;
CREATE TRIGGER runs_keep_last_seq BEFORE UPDATE ON {schema}.runs
    FOR EACH ROW WHEN (NEW.last_seq < OLD.last_seq) EXECUTE FUNCTION {schema}.runs_keep_last_seq();
