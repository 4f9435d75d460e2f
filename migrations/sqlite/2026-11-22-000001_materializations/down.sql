DROP TABLE materializations;
ALTER TABLE endpoint_versions DROP COLUMN eligibility;
