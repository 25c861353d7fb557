-- 0005_node_inventories: a node's inventory (kilobytes of JSON) moves out of
-- its nodes row, which every heartbeat flush updates (last_seen_at): SQLite
-- rewrites a whole row on update, and reading back each inventory's overflow
-- pages once a second was most of an idle gateway's database time at 10,000
-- nodes (docs/performance.md).
CREATE TABLE node_inventories (
    node_id   text PRIMARY KEY REFERENCES nodes (id) ON DELETE CASCADE,
    inventory jsonb NOT NULL
);
INSERT INTO node_inventories (node_id, inventory)
    SELECT id, inventory FROM nodes WHERE inventory IS NOT NULL;
ALTER TABLE nodes DROP COLUMN inventory;
