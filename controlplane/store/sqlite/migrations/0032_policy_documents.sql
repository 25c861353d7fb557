-- expand
-- 0032_policy_documents: policies (issue 46, docs/policies.md). Each tenant
-- has at most one policy document: the YAML text policy apply replaced it
-- with, as applied, and a version that counts applies. Every api process
-- compiles them all and re-reads them when the sum of versions changes.
CREATE TABLE policy_documents (
    tenant_id   text PRIMARY KEY REFERENCES tenants (id),
    document    text NOT NULL,
    names       text NOT NULL DEFAULT '',
    version     integer NOT NULL,
    updated_by  text NOT NULL DEFAULT '',
    updated_at  integer NOT NULL
);
