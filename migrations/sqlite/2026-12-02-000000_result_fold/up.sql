-- How rows appended to its tables reach the stored result (docs/materialization.md, "Folding appended rows"):
-- 'incremental' (folded in) or 'full_refresh_only' with the reason, as the engine said when it wrote the result.
-- NULL for a result written before this column, or by a node of an earlier release: not known until its next
-- refresh.
ALTER TABLE materializations ADD COLUMN result_fold TEXT;
ALTER TABLE materializations ADD COLUMN result_fold_reason TEXT;
