-- expand
-- 0020_rollout_health_gate: health-gated waves (issue 30, item 3;
-- docs/rollouts.md, "Health gate"). Over each wave's soak the reconciler
-- compares the wave's upgraded nodes with the pool's nodes not yet
-- upgraded (package controlplane/pkg/healthgate).
--
-- rollouts.require_evidence halts a wave whose gate is still inconclusive
-- after its one extension (rollouts create --require-evidence);
-- rollouts.health_gates is a JSON array of each wave's gate (store.RolloutGate):
-- both groups' figures, the verdict, and the extension's end while one runs.
ALTER TABLE rollouts ADD COLUMN require_evidence integer NOT NULL DEFAULT 0;
ALTER TABLE rollouts ADD COLUMN health_gates text NOT NULL DEFAULT '[]';
-- rollout_nodes.soak_started_at is when the node came back on the version
-- and its soak began: its part of the wave's window starts there.
ALTER TABLE rollout_nodes ADD COLUMN soak_started_at integer;
-- session_starts records each session a node opens: kind "bcd-start" (no
-- resume cursor: a new bcd process), "drain-reconnect" (the same bcd, back
-- by nodes.reconnect_by plus 30 s: a gateway's drain asked for it) or
-- "drop" (the same bcd, back after its session dropped). The health gate
-- counts bcd restarts and session drops from it; retention.events prunes
-- it with the events.
CREATE TABLE session_starts (
    id      integer PRIMARY KEY AUTOINCREMENT,
    node_id text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    kind    text NOT NULL,
    at      integer NOT NULL
);
CREATE INDEX session_starts_node_idx ON session_starts (node_id, at);
CREATE INDEX session_starts_at_idx ON session_starts (at);
