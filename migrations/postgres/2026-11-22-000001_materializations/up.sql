-- Whether each version can be materialized, decided when it is saved: JSON, {"eligible": {"filters": [...]}} or
-- {"ineligible": {"reason": "..."}}. NULL for versions saved before this migration (analysed on demand).
ALTER TABLE endpoint_versions ADD COLUMN eligibility TEXT;

-- One record per materialized endpoint: the last attempt (Running while leased), and the complete result runs
-- read. `revision` changes with every write, so a claim is a compare-and-set on it.
CREATE TABLE materializations (
    endpoint_id TEXT PRIMARY KEY NOT NULL REFERENCES endpoints (id) ON DELETE CASCADE,
    version BIGINT NOT NULL,
    status TEXT NOT NULL,
    next_run_at BIGINT NOT NULL,
    error TEXT,
    result_version BIGINT,
    result_location TEXT,
    result_row_count BIGINT,
    result_at BIGINT,
    lease_token TEXT,
    lease_expires_at BIGINT,
    revision BIGINT NOT NULL
);
CREATE INDEX materializations_next_run_at ON materializations (next_run_at);
