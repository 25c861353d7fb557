-- expand
-- 0020_remediation_history (expand: adds a table, drops nothing; issue 32,
-- "Memory per node and per GPU"). gpu_findings keeps every finding the
-- remediation reconciler took from the remediation_findings inbox, per node
-- and per GPU (uuid, and board serial where NVML gives one), with what it
-- made of it (outcome: none, opened, joined, failed, other-gpu, held) and
-- the case it opened, joined or failed (remediation_id): the history
-- `remediation history` shows and the count the repeat rule of codes that
-- do not act reads (docs/remediation.md, "Repeats"). It is written in the
-- transaction that takes the finding, so a worker killed mid-way keeps
-- neither; RemediationPrune deletes rows taken before retention.history.
CREATE TABLE gpu_findings (
    id             integer PRIMARY KEY AUTOINCREMENT,
    node_id        text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    gpu_uuid       text NOT NULL DEFAULT '',
    board_serial   text NOT NULL DEFAULT '',
    kind           text NOT NULL,
    severity       text NOT NULL DEFAULT '',
    resolution     text NOT NULL DEFAULT '',
    investigatory  text NOT NULL DEFAULT '',
    xid            integer NOT NULL DEFAULT 0,
    xid_mnemonic   text NOT NULL DEFAULT '',
    message        text NOT NULL DEFAULT '',
    event_id       bigint NOT NULL DEFAULT 0,
    outcome        text NOT NULL DEFAULT '',
    remediation_id text NOT NULL DEFAULT '',
    created_at     integer NOT NULL,
    taken_at       integer NOT NULL
);
CREATE INDEX gpu_findings_node_idx ON gpu_findings (node_id, taken_at);
CREATE INDEX gpu_findings_gpu_idx ON gpu_findings (gpu_uuid, taken_at);
CREATE INDEX gpu_findings_taken_idx ON gpu_findings (taken_at);
