-- The process that claimed an append's key (its name in endpoints_nodes), so that a retry of an append cut off
-- by a crash is taken as soon as that process is known to be gone rather than after a fixed time. Null for
-- keys claimed before this column existed: they keep the fixed time.
ALTER TABLE append_keys ADD COLUMN writer TEXT;
