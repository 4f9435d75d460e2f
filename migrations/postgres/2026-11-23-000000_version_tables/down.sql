ALTER TABLE endpoint_versions DROP COLUMN source_tables;
