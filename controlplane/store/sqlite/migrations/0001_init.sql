-- expand
-- 0001_init: the schema of DESIGN.md's data. Later migrations add columns.
-- Timestamps are integer microseconds since the Unix epoch, UTC; now() and
-- bc_micros() are functions the sqlite backend registers.
CREATE TABLE sites (
    id         text PRIMARY KEY,
    name       text NOT NULL UNIQUE,
    region     text NOT NULL,
    created_at integer NOT NULL
);

CREATE TABLE pools (
    id         text PRIMARY KEY,
    name       text NOT NULL UNIQUE,
    site_id    text NOT NULL REFERENCES sites (id),
    created_at integer NOT NULL
);

CREATE TABLE nodes (
    id               text PRIMARY KEY,
    pool_id          text NOT NULL REFERENCES pools (id),
    hostname         text NOT NULL,
    machine_id       text NOT NULL DEFAULT '',
    state            text NOT NULL,
    cordoned         integer NOT NULL DEFAULT 0,
    labels           text NOT NULL DEFAULT '{}',
    inventory        text,
    inventory_digest text NOT NULL DEFAULT '',
    bcd_version      text NOT NULL DEFAULT '',
    os               text NOT NULL DEFAULT '',
    arch             text NOT NULL DEFAULT '',
    boot_id          text NOT NULL DEFAULT '',
    cert_serial      text NOT NULL DEFAULT '',
    cert_not_after   integer,
    created_at       integer NOT NULL,
    updated_at       integer NOT NULL,
    last_seen_at     integer
);
CREATE INDEX nodes_pool_idx ON nodes (pool_id, id);
CREATE INDEX nodes_machine_idx ON nodes (pool_id, machine_id);

CREATE TABLE join_tokens (
    id          text PRIMARY KEY,
    secret_hash blob NOT NULL,
    pool_id     text NOT NULL REFERENCES pools (id),
    description text NOT NULL DEFAULT '',
    max_uses    integer NOT NULL,
    uses        integer NOT NULL DEFAULT 0,
    expires_at  integer NOT NULL,
    revoked_at  integer,
    created_at  integer NOT NULL
);

CREATE TABLE gateways (
    id           text PRIMARY KEY,
    region       text NOT NULL DEFAULT '',
    address      text NOT NULL DEFAULT '',
    version      text NOT NULL DEFAULT '',
    sessions     integer NOT NULL DEFAULT 0,
    max_streams  integer NOT NULL DEFAULT 0,
    draining     integer NOT NULL DEFAULT 0,
    started_at   integer NOT NULL,
    heartbeat_at integer NOT NULL
);

CREATE TABLE sessions (
    node_id           text PRIMARY KEY REFERENCES nodes (id) ON DELETE CASCADE,
    session_id        text NOT NULL UNIQUE,
    gateway_id        text NOT NULL,
    epoch             integer NOT NULL,
    remote_addr       text NOT NULL DEFAULT '',
    connected_at      integer NOT NULL,
    last_heartbeat_at integer NOT NULL
);
CREATE INDEX sessions_gateway_idx ON sessions (gateway_id);

CREATE TABLE workers (
    id           text PRIMARY KEY,
    roles        text NOT NULL DEFAULT '',
    hostname     text NOT NULL DEFAULT '',
    pid          integer NOT NULL DEFAULT 0,
    version      text NOT NULL DEFAULT '',
    started_at   integer NOT NULL,
    heartbeat_at integer NOT NULL
);

CREATE TABLE leases (
    name        text PRIMARY KEY,
    holder      text NOT NULL,
    epoch       integer NOT NULL,
    acquired_at integer NOT NULL,
    renewed_at  integer NOT NULL,
    expires_at  integer NOT NULL
);

CREATE TABLE commands (
    id               text PRIMARY KEY,
    node_id          text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    kind             text NOT NULL,
    spec             text NOT NULL,
    state            text NOT NULL,
    idempotency_key  text,
    batch_id         text NOT NULL DEFAULT '',
    created_by       text NOT NULL DEFAULT '',
    attempt          integer NOT NULL DEFAULT 0,
    gateway_id       text NOT NULL DEFAULT '',
    exit_code        integer,
    error            text NOT NULL DEFAULT '',
    output_truncated integer NOT NULL DEFAULT 0,
    output_bytes     integer NOT NULL DEFAULT 0,
    result           text,
    cancel_requested integer NOT NULL DEFAULT 0,
    created_at       integer NOT NULL,
    deadline_at      integer NOT NULL,
    dispatched_at    integer,
    started_at       integer,
    finished_at      integer
);
CREATE UNIQUE INDEX commands_idempotency_idx ON commands (node_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX commands_node_state_idx ON commands (node_id, state);
CREATE INDEX commands_state_deadline_idx ON commands (state, deadline_at);
CREATE INDEX commands_batch_idx ON commands (batch_id);

CREATE TABLE command_output (
    command_id text NOT NULL REFERENCES commands (id) ON DELETE CASCADE,
    seq        integer NOT NULL,
    stream     integer NOT NULL,
    data       blob NOT NULL,
    PRIMARY KEY (command_id, seq)
);

CREATE TABLE outbox (
    id         integer PRIMARY KEY AUTOINCREMENT,
    topic      text NOT NULL,
    key        text NOT NULL DEFAULT '',
    payload    text NOT NULL,
    created_at integer NOT NULL
);

CREATE TABLE outbox_cursors (
    sink       text PRIMARY KEY,
    last_id    integer NOT NULL,
    updated_at integer NOT NULL
);

CREATE TABLE events (
    id       integer PRIMARY KEY AUTOINCREMENT,
    node_id  text NOT NULL DEFAULT '',
    kind     text NOT NULL,
    severity text NOT NULL DEFAULT '',
    message  text NOT NULL DEFAULT '',
    time     integer NOT NULL,
    payload  text
);
CREATE INDEX events_node_idx ON events (node_id, id);
CREATE INDEX events_time_idx ON events (time);

CREATE TABLE audit_log (
    id        integer PRIMARY KEY AUTOINCREMENT,
    time      integer NOT NULL,
    actor     text NOT NULL DEFAULT '',
    action    text NOT NULL,
    resource  text NOT NULL DEFAULT '',
    outcome   text NOT NULL,
    source_ip text NOT NULL DEFAULT '',
    details   text
);
CREATE INDEX audit_log_time_idx ON audit_log (time);

CREATE TABLE pki_bundle (
    id           integer PRIMARY KEY CHECK (id = 1),
    trust_domain text NOT NULL,
    sealed       blob NOT NULL,
    created_at   integer NOT NULL,
    updated_at   integer NOT NULL
);

CREATE TABLE revocations (
    serial     text PRIMARY KEY,
    node_id    text NOT NULL DEFAULT '',
    reason     text NOT NULL DEFAULT '',
    revoked_at integer NOT NULL
);
CREATE INDEX revocations_time_idx ON revocations (revoked_at);

CREATE TABLE api_tokens (
    id          text PRIMARY KEY,
    secret_hash blob NOT NULL UNIQUE,
    role        text NOT NULL,
    description text NOT NULL DEFAULT '',
    allow_cidrs text NOT NULL DEFAULT '[]',
    expires_at  integer,
    revoked_at  integer,
    created_at  integer NOT NULL
);

CREATE TABLE secrets (
    name       text PRIMARY KEY,
    node_id    text NOT NULL DEFAULT '',
    sealed     blob NOT NULL,
    created_at integer NOT NULL
);
