ALTER TABLE materializations DROP COLUMN full_refreshes;
ALTER TABLE materializations DROP COLUMN rows_folded;
ALTER TABLE materializations DROP COLUMN last_folded_at;
ALTER TABLE materializations DROP COLUMN result_coverage;
ALTER TABLE materializations DROP COLUMN result_data_as_of;
ALTER TABLE materializations DROP COLUMN appended_since;
ALTER TABLE endpoints DROP COLUMN freshness_seconds;
