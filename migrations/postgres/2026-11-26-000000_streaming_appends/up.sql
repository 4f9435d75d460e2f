-- Streaming appends (contract section 17).

-- Who maintains (compacts) a table: one process at a time among those sharing the database, until the lease
-- expires (microseconds since the epoch) or is given back.
CREATE TABLE table_leases (
    project_id BIGINT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    table_name TEXT NOT NULL,
    holder TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (project_id, table_name)
);

-- The Idempotency-Key of each append, kept 24 hours: the SHA-256 of its body (a reuse with another body is a
-- conflict), the id its rows are written under (in their file's metadata, so that a write cut off by a crash
-- can be found), and once written, its answer (JSON).
CREATE TABLE append_keys (
    project_id BIGINT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    table_name TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    body_sha256 TEXT NOT NULL,
    write_id TEXT NOT NULL,
    answer TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (project_id, table_name, idempotency_key)
);
CREATE INDEX append_keys_created_at ON append_keys (created_at);
