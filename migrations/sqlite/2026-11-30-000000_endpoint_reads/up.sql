-- The tables each endpoint's current version reads, kept with every write of a version: a write to a table finds
-- the endpoints to tell through this index instead of reading every endpoint of the project. A row whose table is
-- `*` (never a table's name) stands for an endpoint whose tables are unknown, a version written before they were
-- recorded: it may read any table, and its query is planned to tell.
CREATE TABLE endpoint_reads (
    project_id BIGINT NOT NULL,
    table_name TEXT NOT NULL,
    endpoint_id TEXT NOT NULL REFERENCES endpoints (id) ON DELETE CASCADE,
    PRIMARY KEY (project_id, table_name, endpoint_id)
);
CREATE INDEX endpoint_reads_endpoint ON endpoint_reads (endpoint_id);
INSERT INTO endpoint_reads (project_id, table_name, endpoint_id)
SELECT DISTINCT e.project_id, t.value, e.id
FROM endpoints e
JOIN endpoint_versions v ON v.endpoint_id = e.id AND v.version = e.current_version, json_each(v.source_tables) t
WHERE v.source_tables IS NOT NULL;
INSERT INTO endpoint_reads (project_id, table_name, endpoint_id)
SELECT e.project_id, '*', e.id
FROM endpoints e JOIN endpoint_versions v ON v.endpoint_id = e.id AND v.version = e.current_version
WHERE v.source_tables IS NULL;
