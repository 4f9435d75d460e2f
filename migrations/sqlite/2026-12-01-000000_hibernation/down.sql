ALTER TABLE endpoints DROP COLUMN hibernate_after_days;
