-- expand
-- 0014_rollouts: rollouts of bcd in waves (issue 20, DESIGN.md "Rollouts of
-- bcd"; docs/rollouts.md). A rollout moves the nodes of one pool to version;
-- the reconciler of its shard (the shard of its id) drives it: canary wave,
-- then waves of wave ("N" or "N%") nodes, at most max_unavailable out at
-- once and within the pool's disruption budget; each node must come back on
-- the version within timeout_us and stay ready for soak_us. rollout_nodes
-- holds one row per node of the pool at create: its version before, its
-- state, its wave and the commands sent (each with the idempotency key
-- rollout:<id>:upgrade or rollout:<id>:rollback, so a worker that takes over
-- never sends a second). At most one rollout per pool is active or halted.
CREATE TABLE rollouts (
    id              text PRIMARY KEY,
    pool_id         text NOT NULL REFERENCES pools (id) ON DELETE CASCADE,
    version         text NOT NULL,
    base_url        text NOT NULL DEFAULT '',
    canary          integer NOT NULL CHECK (canary >= 1),
    wave            text NOT NULL,
    max_unavailable text NOT NULL,
    soak_us         integer NOT NULL CHECK (soak_us >= 0),
    timeout_us      integer NOT NULL CHECK (timeout_us > 0),
    drain           integer NOT NULL DEFAULT 1,
    state           text NOT NULL,
    current_wave    integer NOT NULL DEFAULT 0,
    reason          text NOT NULL DEFAULT '',
    failed_node_id  text NOT NULL DEFAULT '',
    created_by      text NOT NULL DEFAULT '',
    created_at      integer NOT NULL,
    updated_at      integer NOT NULL,
    finished_at     integer
);
CREATE UNIQUE INDEX rollouts_pool_open_idx ON rollouts (pool_id)
    WHERE state IN ('pending', 'running', 'paused', 'rolling-back', 'halted');
CREATE INDEX rollouts_active_idx ON rollouts (state) WHERE state IN ('pending', 'running', 'paused', 'rolling-back');

CREATE TABLE rollout_nodes (
    rollout_id          text NOT NULL REFERENCES rollouts (id) ON DELETE CASCADE,
    node_id             text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    previous_version    text NOT NULL DEFAULT '',
    state               text NOT NULL,
    wave                integer NOT NULL DEFAULT 0,
    upgrade_command_id  text NOT NULL DEFAULT '',
    rollback_command_id text NOT NULL DEFAULT '',
    reason              text NOT NULL DEFAULT '',
    state_since         integer NOT NULL,
    PRIMARY KEY (rollout_id, node_id)
);
CREATE INDEX rollout_nodes_node_idx ON rollout_nodes (node_id);
