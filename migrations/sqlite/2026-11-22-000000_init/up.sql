-- Timestamps are microseconds since the Unix epoch (UTC) in both backends, so one code path reads them.
CREATE TABLE projects (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY NOT NULL,
    project_id BIGINT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    label TEXT NOT NULL,
    scopes TEXT NOT NULL,
    secret_hash TEXT NOT NULL UNIQUE,
    prefix TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT,
    revoked_at BIGINT
);
CREATE INDEX api_keys_project_id ON api_keys (project_id);

-- Deleting an endpoint removes its row (and, by cascade, its versions), so a plain unique index frees the name.
CREATE TABLE endpoints (
    id TEXT PRIMARY KEY NOT NULL,
    project_id BIGINT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    description TEXT NOT NULL,
    derived_from_insight TEXT,
    is_active BOOLEAN NOT NULL,
    is_materialized BOOLEAN NOT NULL,
    cache_age_seconds BIGINT,
    sync_frequency TEXT,
    current_version BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    last_executed_at BIGINT
);
CREATE UNIQUE INDEX endpoints_project_name ON endpoints (project_id, name);

CREATE TABLE endpoint_versions (
    endpoint_id TEXT NOT NULL REFERENCES endpoints (id) ON DELETE CASCADE,
    version BIGINT NOT NULL,
    query TEXT NOT NULL,
    description TEXT NOT NULL,
    output_columns TEXT NOT NULL,
    cache_age_seconds BIGINT,
    sync_frequency TEXT,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (endpoint_id, version)
);
