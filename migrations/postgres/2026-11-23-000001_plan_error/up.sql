-- Why a version's query no longer plans, set when a table it reads was replaced with other columns (and
-- cleared when a later replace makes it plan again); its runs answer 400 query_invalid while it is set.
ALTER TABLE endpoint_versions ADD COLUMN plan_error TEXT;
