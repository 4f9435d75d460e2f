ALTER TABLE endpoint_versions DROP COLUMN plan_error;
