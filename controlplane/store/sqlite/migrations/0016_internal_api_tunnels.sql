-- expand
-- 0016_internal_api_tunnels: the internal control API (issue 21,
-- docs/tunnels.md). Each gateway advertises the host:port of its internal
-- control API listener (host.gateway.internal), so the api can wake the
-- gateway holding a node's session, found from the session row, right after
-- it commits that node's commands. Empty: the gateway serves no internal API
-- and is woken by LISTEN/NOTIFY or its loop, as before.
ALTER TABLE gateways ADD COLUMN internal_address text NOT NULL DEFAULT '';

-- Tunnels (shells and port forwards, docs/tunnels.md): tunnels.create
-- stores a one-use ticket (only its SHA-256 hash) valid 30 s; opening the
-- WebSocket uses it (opened_at), and the tunnel's end records the bytes
-- each way, the exit status and why it ended.
CREATE TABLE tunnels (
    id          text PRIMARY KEY,
    secret_hash blob NOT NULL,
    node_id     text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    kind        text NOT NULL,
    port        integer NOT NULL DEFAULT 0,
    as_root     integer NOT NULL DEFAULT 0,
    created_by  text NOT NULL,
    created_at  integer NOT NULL,
    expires_at  integer NOT NULL,
    opened_at   integer,
    closed_at   integer,
    gateway_id  text NOT NULL DEFAULT '',
    bytes_in    integer NOT NULL DEFAULT 0,
    bytes_out   integer NOT NULL DEFAULT 0,
    exit_code   integer,
    reason      text NOT NULL DEFAULT ''
);
CREATE INDEX tunnels_node_idx ON tunnels (node_id);
