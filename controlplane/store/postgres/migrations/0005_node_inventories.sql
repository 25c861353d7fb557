-- contract
-- (contract: drops nodes.inventory and nodes.inventory_digest.)
-- 0005_node_inventories: a node's inventory (kilobytes of JSON) and its
-- digest move out of its nodes row, which every heartbeat flush updates
-- (last_seen_at): SQLite rewrites a whole row on update, and reading back
-- each inventory's overflow pages once a second was most of an idle
-- gateway's database time at 10,000 nodes (docs/performance.md). Inventory
-- writes then lock no nodes row, so they cannot deadlock with the flush.
CREATE TABLE node_inventories (
    node_id   text PRIMARY KEY REFERENCES nodes (id) ON DELETE CASCADE,
    inventory jsonb,
    digest    text NOT NULL DEFAULT ''
);
INSERT INTO node_inventories (node_id, inventory, digest)
    SELECT id, inventory, inventory_digest FROM nodes
    WHERE inventory IS NOT NULL OR inventory_digest <> '';
ALTER TABLE nodes DROP COLUMN inventory;
ALTER TABLE nodes DROP COLUMN inventory_digest;
