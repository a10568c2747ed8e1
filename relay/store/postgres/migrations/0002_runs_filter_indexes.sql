-- GET /v1/runs asks for one agent's runs (an adapter re-attaching: the
-- agent's running run) or one company's, newest first; the relays ask for
-- the runs not done (finishing those whose pods vanished). Each is read by
-- an index rather than by every run.
CREATE INDEX runs_agent ON {schema}.runs (agent, seen_at DESC);
CREATE INDEX runs_company ON {schema}.runs (company, seen_at DESC);
CREATE INDEX runs_unfinished ON {schema}.runs (seen_at DESC) WHERE NOT done;
