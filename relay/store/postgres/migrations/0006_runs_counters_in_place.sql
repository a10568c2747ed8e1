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
