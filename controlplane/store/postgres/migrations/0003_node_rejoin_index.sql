-- expand
-- 0003_node_rejoin_index: a re-join looks a node up by machine id, then by
-- hostname, within the pool; both lookups use an index.
CREATE INDEX nodes_pool_hostname_idx ON nodes (pool_id, hostname);
