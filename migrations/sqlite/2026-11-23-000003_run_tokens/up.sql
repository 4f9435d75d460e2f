-- Run tokens (contract section 15): each project's secret that signs them, made on its first token (64 hex
-- digits; replacing it revokes every token of the project), and the web origins whose pages may call its runs
-- (space-separated, as browsers send them).
ALTER TABLE projects ADD COLUMN token_secret TEXT;
ALTER TABLE projects ADD COLUMN allowed_origins TEXT NOT NULL DEFAULT '';
-- When the key, or a run token it issued, last authenticated a request (microseconds since the epoch).
ALTER TABLE api_keys ADD COLUMN last_used_at BIGINT;
