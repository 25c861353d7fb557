-- expand
-- 0033_oidc_sessions: single sign-on for people (issue 47, docs/sso.md).
-- A person signed in through the configured OpenID provider holds a
-- session; the bearer token its CLI or fleet page uses is an API token row
-- of that session (session_id), short-lived and replaced at each refresh,
-- carrying the person's subject and groups as of that refresh. The
-- provider's refresh token stays here, never with the client: the control
-- plane refreshes at the provider, so a group removed there is lost at the
-- next refresh. oidc_logins are logins in progress (device flow or the
-- page's authorization code flow), short-lived.
ALTER TABLE api_tokens ADD COLUMN session_id text NOT NULL DEFAULT '';
ALTER TABLE api_tokens ADD COLUMN subject text NOT NULL DEFAULT '';
ALTER TABLE api_tokens ADD COLUMN display_name text NOT NULL DEFAULT '';
ALTER TABLE api_tokens ADD COLUMN groups text NOT NULL DEFAULT '';
CREATE TABLE oidc_sessions (
    id               text PRIMARY KEY,
    subject          text NOT NULL,
    display_name     text NOT NULL DEFAULT '',
    tenant_id        text NOT NULL REFERENCES tenants (id),
    role             text NOT NULL,
    groups           text NOT NULL DEFAULT '',
    client           text NOT NULL,
    refresh_hash     bytea,
    provider_refresh text NOT NULL DEFAULT '',
    created_at       timestamptz NOT NULL,
    refreshed_at     timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    ended_at         timestamptz,
    end_reason       text NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX oidc_sessions_refresh ON oidc_sessions (refresh_hash);
CREATE INDEX oidc_sessions_subject ON oidc_sessions (subject);
CREATE TABLE oidc_logins (
    id_hash     bytea PRIMARY KEY,
    kind        text NOT NULL,
    tenant      text NOT NULL DEFAULT '',
    device_code text NOT NULL DEFAULT '',
    verifier    text NOT NULL DEFAULT '',
    nonce       text NOT NULL DEFAULT '',
    interval_s  integer NOT NULL DEFAULT 5,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);
