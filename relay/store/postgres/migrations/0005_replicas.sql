-- replicas: the relays collecting this schema's runs, one row per running
-- relay process, renewed by it (renewed_at) and live while expires_at is
-- ahead of the server's now(), and for each reader at most its own
-- duration after renewed_at (Store.Replicas, package replicas). Unlogged: after a
-- server crash the table is empty and every live relay writes its row
-- again at its next renewal, so its rows need no WAL. The id is random
-- per process and read by relays only: it is what the division of runs
-- hashes, so a tenant cannot name runs for one replica.
CREATE UNLOGGED TABLE {schema}.replicas (
    id         text PRIMARY KEY,
    name       text NOT NULL,
    renewed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
-- The division of runs no longer needs a secret: the ids above are
-- unknown outside the database.
DROP TABLE {schema}.keys;
