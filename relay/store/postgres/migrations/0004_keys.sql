-- keys: secrets the relays sharing this schema share. "rendezvous" keys
-- the hash that gives each run its replica (replicas.Pick), so that a
-- tenant who can read the replicas' pod names cannot name its Jobs for
-- one replica. The first relay to start writes it (Store.ensureKeys).
CREATE TABLE {schema}.keys (
    name  text PRIMARY KEY,
    value bytea NOT NULL
);
