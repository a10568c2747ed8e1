-- retired_runs: what is kept of a run retention deleted while its pods
-- may remain (store.Retired), so that no relay collects them again; one
-- row per Job (by its namespace too: a pod names its controller itself),
-- deleted once no pod of the Job remains. Times are Unix
-- nanoseconds (0: unknown).
CREATE TABLE {schema}.retired_runs (
    namespace   text NOT NULL,
    job_uid     text NOT NULL,
    run         text NOT NULL,
    pod_created bigint NOT NULL,
    retired_at  bigint NOT NULL,
    PRIMARY KEY (namespace, job_uid)
);
