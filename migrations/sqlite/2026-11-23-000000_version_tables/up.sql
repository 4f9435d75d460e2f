-- The tables each version's query reads: a JSON array of names, recorded when the version is saved, so the
-- endpoints that read a table are found without planning every query again. NULL for versions saved before
-- this migration (planned on demand).
ALTER TABLE endpoint_versions ADD COLUMN source_tables TEXT;
