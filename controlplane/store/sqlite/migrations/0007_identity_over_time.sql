-- expand
-- 0007_identity_over_time: what a node's identity needs to last (DESIGN.md,
-- "Identity over time").
--   nodes.key_sha256     hex SHA-256 of the SubjectPublicKeyInfo of the key of
--                        the node's latest certificate: re-attestation and a
--                        re-join by proof accept that key only.
--   nodes.join_token_id  the token that made the node; with key_sha256 it
--                        makes a repeated Join (a lost reply) idempotent.
--   nodes.clock_skew_ms  the node's clock minus the gateway's, from its
--                        heartbeats, and when it was measured.
--   join_tokens.node_id  set for a token made by nodes reinstall: it joins as
--                        that node, whatever the machine says.
ALTER TABLE nodes ADD COLUMN key_sha256 text NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN join_token_id text NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN clock_skew_ms integer;
ALTER TABLE nodes ADD COLUMN clock_skew_at integer;
ALTER TABLE join_tokens ADD COLUMN node_id text;
CREATE INDEX nodes_join_key_idx ON nodes (join_token_id, key_sha256);
