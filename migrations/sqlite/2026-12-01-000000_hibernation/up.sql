-- Hibernation (docs/materialization.md): a materialized endpoint that nobody runs or changes for this many days
-- stops refreshing and folding until a run wakes it. NULL is the default (7 days), so that every endpoint
-- written before this column, or by a node of an earlier release, hibernates as one created without the
-- setting does; 0 is never.
ALTER TABLE endpoints ADD COLUMN hibernate_after_days BIGINT;
