-- expand
-- 0030_dead_letter_tenant (expand: adds a column, drops nothing; tenant
-- scoping review, docs/tenants.md "Sinks"). tenant_id is the tenant a dead
-- letter was for: the id of its sink's tenant (sinks.*[].tenant) when the
-- sink gave up on it; '' for a deployment-wide sink's and the dead letters
-- made before, which only the root's callers see.
ALTER TABLE sink_dead_letters ADD COLUMN tenant_id text NOT NULL DEFAULT '';
