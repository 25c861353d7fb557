-- expand
-- 0024_tenants (expand: adds a table and columns, drops nothing; issue 45,
-- "Tenants", docs/tenants.md). Tenants form a tree under the root tenant;
-- path is the ids from the root down, each followed by '/' ("root/",
-- "root/ten_x/"), so a subtree is the rows whose path starts with its
-- root's. suspended_at and deleted_at stop the tenant and everything under
-- it. Sites, pools and API tokens name their tenant; what hangs off a pool
-- (its nodes, join tokens, reservations, rollouts, commands and node events)
-- belongs to the pool's tenant, so moving a pool moves all of it at once.
-- Every existing row becomes the root tenant's; audit rows name the tenant
-- of the caller they record. SQLite refuses ADD COLUMN with both a
-- REFERENCES clause and a non-NULL default, so the added columns carry no
-- foreign key here; the store writes only tenant ids it has read.
CREATE TABLE tenants (
    id           text PRIMARY KEY,
    name         text NOT NULL,
    parent_id    text REFERENCES tenants (id),
    path         text NOT NULL UNIQUE,
    suspended_at integer,
    deleted_at   integer,
    created_at   integer NOT NULL
);
CREATE UNIQUE INDEX tenants_live_name_idx ON tenants (name) WHERE deleted_at IS NULL;
CREATE INDEX tenants_parent_idx ON tenants (parent_id);
INSERT INTO tenants (id, name, parent_id, path, created_at) VALUES ('root', 'root', NULL, 'root/', now());

ALTER TABLE sites ADD COLUMN tenant_id text NOT NULL DEFAULT 'root';
ALTER TABLE pools ADD COLUMN tenant_id text NOT NULL DEFAULT 'root';
ALTER TABLE api_tokens ADD COLUMN tenant_id text NOT NULL DEFAULT 'root';
ALTER TABLE audit_log ADD COLUMN tenant_id text NOT NULL DEFAULT 'root';
CREATE INDEX pools_tenant_idx ON pools (tenant_id);
CREATE INDEX audit_log_tenant_idx ON audit_log (tenant_id, id);
