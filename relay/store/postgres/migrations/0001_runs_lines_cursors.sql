-- The relay's tables. {schema} is the configured schema, quoted.

-- runs: one row per run. record is the whole Run as JSON (what GET
-- /v1/runs/{run} serves); the columns before it are its summary (what
-- lists filter and sort by and retention decides by), written with it.
-- num keys the run's lines: a run deleted by retention and a later run
-- under the same id never share lines.
CREATE TABLE {schema}.runs (
    id        text PRIMARY KEY,
    num       bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    namespace text NOT NULL,
    pod       text NOT NULL,
    pod_uid   text NOT NULL,
    agent     text NOT NULL,
    company   text NOT NULL,
    phase     text NOT NULL,
    done      boolean NOT NULL,
    last_seq  bigint NOT NULL,
    bytes     bigint NOT NULL,
    -- Unix nanoseconds (0: never): exact, as the record's.
    seen_at   bigint NOT NULL,
    record    bytea NOT NULL
);
CREATE INDEX runs_seen_at ON {schema}.runs (seen_at DESC);

-- lines: a run's lines under a dense sequence. data is the Line as JSON,
-- exactly what a log stream sends (bytea: a line may hold any byte);
-- size is its length, which bounds a page without reading data.
CREATE TABLE {schema}.lines (
    run  bigint NOT NULL,
    seq  bigint NOT NULL,
    size integer NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (run, seq)
);

-- cursors: how far each container stream of a run is stored. Written in
-- the transaction that writes the stream's lines.
CREATE TABLE {schema}.cursors (
    run    text NOT NULL,
    stream text NOT NULL,
    ts     bigint NOT NULL,
    count  integer NOT NULL,
    PRIMARY KEY (run, stream)
);

-- mirror: how much of a run's log its NDJSON mirror file holds (JSON).
CREATE TABLE {schema}.mirror (
    run   text PRIMARY KEY,
    state bytea NOT NULL
);

-- retired: runs retention deleted whose lines are still being deleted,
-- in batches; a relay that stopped half way finishes them.
CREATE TABLE {schema}.retired (
    num bigint PRIMARY KEY
);
