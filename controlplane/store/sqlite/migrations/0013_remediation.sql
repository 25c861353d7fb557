-- expand
-- 0013_remediation: closed-loop GPU remediation (issue 19, DESIGN.md "GPU
-- health and closed-loop remediation"). remediation_findings is the inbox
-- of node events that carry NVIDIA's resolution (or a health judgement's),
-- written in the event's own transaction and taken (deleted) by the
-- remediation reconciler of the node's shard, so no finding is lost or read
-- twice whatever order transactions commit in. remediations holds one row
-- per node case: detected, held (the breaker was tripped), quarantined,
-- draining, remediating, verifying, then returned or escalated; at most one
-- open case (closed_at null) per node. command_ids lists every command the
-- case enqueued (each with the idempotency key remediation:<id>:<attempt>);
-- boot_id is the node's boot id when the action started (a reboot is seen
-- done when it changes).
-- remediation_breakers is each pool's circuit breaker: tripped_at set while
-- tripped; quarantines counted since the later of the window's start and
-- reset_at. secret_grants lets a site's BMC agent open another node's
-- sealed BMC secret for one command (a power command on a silent node's
-- BMC): JoinService.Secret takes the grant (deletes it) when the agent
-- asks, and refuses once it has expired.
CREATE TABLE remediation_findings (
    id           integer PRIMARY KEY AUTOINCREMENT,
    node_id      text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    shard        integer NOT NULL,
    kind         text NOT NULL,
    severity     text NOT NULL DEFAULT '',
    resolution   text NOT NULL DEFAULT '',
    xid          integer NOT NULL DEFAULT 0,
    xid_mnemonic text NOT NULL DEFAULT '',
    gpu_uuid     text NOT NULL DEFAULT '',
    message      text NOT NULL DEFAULT '',
    event_id     bigint NOT NULL DEFAULT 0,
    created_at   integer NOT NULL
);
CREATE INDEX remediation_findings_shard_idx ON remediation_findings (shard, id);

CREATE TABLE remediations (
    id             text PRIMARY KEY,
    node_id        text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    pool_id        text NOT NULL,
    shard          integer NOT NULL,
    state          text NOT NULL,
    finding        text NOT NULL,
    kind           text NOT NULL DEFAULT '',
    resolution     text NOT NULL DEFAULT '',
    xid            integer NOT NULL DEFAULT 0,
    xid_mnemonic   text NOT NULL DEFAULT '',
    gpu_uuid       text NOT NULL DEFAULT '',
    message        text NOT NULL DEFAULT '',
    action         text NOT NULL,
    attempts       integer NOT NULL DEFAULT 0,
    command_id     text NOT NULL DEFAULT '',
    command_ids    text NOT NULL DEFAULT '[]',
    boot_id        text NOT NULL DEFAULT '',
    paused         integer NOT NULL DEFAULT 0,
    reason         text NOT NULL DEFAULT '',
    next_at        integer NOT NULL,
    state_since    integer NOT NULL,
    quarantined_at integer,
    created_at     integer NOT NULL,
    updated_at     integer NOT NULL,
    closed_at      integer
);
CREATE UNIQUE INDEX remediations_open_node_idx ON remediations (node_id) WHERE closed_at IS NULL;
CREATE INDEX remediations_open_shard_idx ON remediations (shard, next_at) WHERE closed_at IS NULL;
CREATE INDEX remediations_pool_quarantined_idx ON remediations (pool_id, quarantined_at);
CREATE INDEX remediations_created_idx ON remediations (created_at, id);

CREATE TABLE remediation_breakers (
    pool_id    text PRIMARY KEY REFERENCES pools (id) ON DELETE CASCADE,
    tripped_at integer,
    reset_at   integer,
    reset_by   text NOT NULL DEFAULT ''
);

CREATE TABLE secret_grants (
    name       text NOT NULL,
    node_id    text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    command_id text NOT NULL,
    expires_at integer NOT NULL,
    PRIMARY KEY (name, node_id, command_id)
);
