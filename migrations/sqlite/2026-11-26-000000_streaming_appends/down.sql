DROP TABLE append_keys;
DROP TABLE table_leases;
