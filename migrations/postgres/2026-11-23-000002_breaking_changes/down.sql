ALTER TABLE endpoint_versions DROP COLUMN breaking_changes;
