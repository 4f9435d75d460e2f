-- Fresh materializations (contract section 18).

-- How soon appended rows reach an endpoint's stored result, in seconds; NULL is the default (60).
ALTER TABLE endpoints ADD COLUMN freshness_seconds BIGINT;

-- Since when rows appended to a table the query reads are not in the stored result (microseconds since the
-- epoch); the refresh that includes them is due freshness_seconds later. NULL when none wait.
ALTER TABLE materializations ADD COLUMN appended_since BIGINT;

-- The time up to which appended rows are in the stored result: when its refresh began reading the tables.
-- Results stored before this column existed say when they were completed, the closest that is known.
ALTER TABLE materializations ADD COLUMN result_data_as_of BIGINT;
UPDATE materializations SET result_data_as_of = result_at;

-- What of its tables the stored result holds, as the engine that wrote it says it (JSON: for each table the
-- version and files it read), so that the rows appended since can be folded into it; NULL for a result written
-- before (refreshed in full once, then folded).
ALTER TABLE materializations ADD COLUMN result_coverage TEXT;

-- When appended rows were last folded into the result, and how many rows folds added over the record's life.
ALTER TABLE materializations ADD COLUMN last_folded_at BIGINT;
ALTER TABLE materializations ADD COLUMN rows_folded BIGINT NOT NULL DEFAULT 0;

-- Refreshes completed over the record's life; a record with a result has had at least one.
ALTER TABLE materializations ADD COLUMN full_refreshes BIGINT NOT NULL DEFAULT 0;
UPDATE materializations SET full_refreshes = 1 WHERE result_at IS NOT NULL;
