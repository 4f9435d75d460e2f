ALTER TABLE api_keys DROP COLUMN last_used_at;
ALTER TABLE projects DROP COLUMN allowed_origins;
ALTER TABLE projects DROP COLUMN token_secret;
