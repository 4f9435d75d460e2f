DROP TABLE endpoint_versions;
DROP TABLE endpoints;
DROP TABLE api_keys;
DROP TABLE projects;
