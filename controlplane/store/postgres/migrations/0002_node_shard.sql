-- expand
-- 0002_node_shard: each node belongs to one of the 256 shards (store.ShardOf
-- of its id), so the shard's lease holder alone reconciles it.
ALTER TABLE nodes ADD COLUMN shard integer NOT NULL DEFAULT 0;
CREATE INDEX nodes_shard_state_idx ON nodes (shard, state);
