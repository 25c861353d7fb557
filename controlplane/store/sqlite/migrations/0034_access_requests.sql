-- expand
-- 0034_access_requests: access requests (issue 47, docs/access.md). A
-- person or token asks for a requestable policy of its tenant for a time,
-- with a reason; an approver the policy names approves or denies it; an
-- approved request grants the policy's statements from its approval
-- (starts_at) until ends_at. requester and decided_by are identities
-- ("user:<subject>" or "token:<id>"). scope_kind and scope_id, when set,
-- limit the grant's allows to one pool, site, node or tenant. state is
-- pending, approved, denied, revoked or expired; a pending request older
-- than 24 h, or an approved one whose end passed, reads expired before
-- the sweep stores it. Every api process reads the active grants through
-- access_requests_active.
CREATE TABLE access_requests (
    id              text PRIMARY KEY,
    tenant_id       text NOT NULL REFERENCES tenants (id),
    requester       text NOT NULL,
    requester_name  text NOT NULL DEFAULT '',
    requester_role  text NOT NULL,
    policy          text NOT NULL,
    scope_kind      text NOT NULL DEFAULT '',
    scope_id        text NOT NULL DEFAULT '',
    scope_name      text NOT NULL DEFAULT '',
    duration_us     integer NOT NULL,
    reason          text NOT NULL,
    state           text NOT NULL,
    created_at      integer NOT NULL,
    decided_at      integer,
    decided_by      text NOT NULL DEFAULT '',
    decided_by_name text NOT NULL DEFAULT '',
    starts_at       integer,
    ends_at         integer,
    note            text NOT NULL DEFAULT ''
);
CREATE INDEX access_requests_active ON access_requests (state, ends_at);
CREATE INDEX access_requests_pending ON access_requests (state, created_at);
CREATE INDEX access_requests_requester ON access_requests (requester, state);
CREATE INDEX access_requests_tenant ON access_requests (tenant_id, id);
