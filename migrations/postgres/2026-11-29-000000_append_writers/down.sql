ALTER TABLE append_keys DROP COLUMN writer;
