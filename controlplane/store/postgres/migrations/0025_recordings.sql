-- expand
-- 0024_recordings (expand: adds tables, drops nothing; issue 48, docs/tunnels.md,
-- "Recorded shells"). Every shell a control-plane process relays is recorded
-- there: a recordings row per shell, and its events (typed, printed, window
-- sizes, with their times) in numbered chunks, each sealed under the
-- deployment secret. retention.recordings prunes both, counted from the
-- start; a deleted node takes its recordings with it only then, not at once.
CREATE TABLE recordings (
    id         text PRIMARY KEY,
    tunnel_id  text NOT NULL,
    node_id    text NOT NULL,
    created_by text NOT NULL,
    as_root    boolean NOT NULL DEFAULT false,
    started_at timestamptz NOT NULL,
    ended_at   timestamptz,
    bytes      bigint NOT NULL DEFAULT 0,
    chunks     integer NOT NULL DEFAULT 0,
    state      text NOT NULL,
    reason     text NOT NULL DEFAULT ''
);
CREATE INDEX recordings_started_idx ON recordings (started_at, id);
CREATE INDEX recordings_node_idx ON recordings (node_id, started_at);

CREATE TABLE recording_chunks (
    recording_id text NOT NULL,
    seq          integer NOT NULL,
    sealed       bytea NOT NULL,
    PRIMARY KEY (recording_id, seq)
);
