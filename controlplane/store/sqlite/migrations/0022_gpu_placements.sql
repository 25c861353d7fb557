-- expand
-- 0022_gpu_placements (expand: adds a table, drops nothing; issue 44,
-- "A history that follows the board", docs/remediation.md). gpu_placements
-- keeps each stay of a GPU (by UUID, with NVML's board serial and model) in
-- a node: one row from the inventory that first listed it there
-- (first_seen) to the last that did (last_seen); current is set while the
-- node's latest inventory lists it. The gateway writes it with the node's
-- inventory, so only when the inventory's digest changed. health is the
-- node's judgement of the GPU in that inventory (ok, degraded, failed, or
-- empty when not judged); conflict names the other live node that reported
-- the same UUID at the same time (gpu.uuid-conflict), empty when none.
CREATE TABLE gpu_placements (
    id           integer PRIMARY KEY AUTOINCREMENT,
    gpu_uuid     text NOT NULL,
    node_id      text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    board_serial text NOT NULL DEFAULT '',
    model        text NOT NULL DEFAULT '',
    health       text NOT NULL DEFAULT '',
    conflict     text NOT NULL DEFAULT '',
    current      integer NOT NULL DEFAULT 0,
    first_seen   integer NOT NULL,
    last_seen    integer NOT NULL
);
CREATE INDEX gpu_placements_gpu_idx ON gpu_placements (gpu_uuid, first_seen);
CREATE INDEX gpu_placements_node_idx ON gpu_placements (node_id, current);
