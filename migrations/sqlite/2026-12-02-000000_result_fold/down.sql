ALTER TABLE materializations DROP COLUMN result_fold_reason;
ALTER TABLE materializations DROP COLUMN result_fold;
