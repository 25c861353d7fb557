-- expand
-- 0018_rollout_watch: a rollout watches every node it upgraded until it
-- ends, plus a bake (issue 30; DESIGN.md, "Memory and evidence").
--
-- nodes.bcd_starts counts the sessions a node opened without a resume
-- cursor: each is a new bcd process (a start, a restart, an upgrade's
-- re-exec), never a reconnect of a running one.
ALTER TABLE nodes ADD COLUMN bcd_starts integer NOT NULL DEFAULT 0;
-- rollouts.bake_us is how long the rollout keeps watching after its last
-- wave. bake_started_at is when that phase began (NULL before it);
-- bake_elapsed_us the bake time counted up to bake_resumed_at, the moment
-- its clock last started (NULL while the rollout is paused).
ALTER TABLE rollouts ADD COLUMN bake_us integer NOT NULL DEFAULT 0 CHECK (bake_us >= 0);
ALTER TABLE rollouts ADD COLUMN bake_started_at integer;
ALTER TABLE rollouts ADD COLUMN bake_elapsed_us integer NOT NULL DEFAULT 0;
ALTER TABLE rollouts ADD COLUMN bake_resumed_at integer;
-- rollout_nodes: the node's bcd_starts when it came back on the version
-- (watch_starts), the start of the last session the reconciler saw
-- (session_since), and its session drops since, those after a gateway's
-- drain not counted (drops).
ALTER TABLE rollout_nodes ADD COLUMN watch_starts integer NOT NULL DEFAULT 0;
ALTER TABLE rollout_nodes ADD COLUMN session_since integer;
ALTER TABLE rollout_nodes ADD COLUMN drops integer NOT NULL DEFAULT 0;
