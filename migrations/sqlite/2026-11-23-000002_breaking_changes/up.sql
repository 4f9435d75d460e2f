-- The output columns a version removed or retyped compared with the version before it, as a JSON array of
-- {"column", "change": "removed" | "type_changed", "from", "to"}; versions saved before it was recorded have none.
ALTER TABLE endpoint_versions ADD COLUMN breaking_changes TEXT NOT NULL DEFAULT '[]';
