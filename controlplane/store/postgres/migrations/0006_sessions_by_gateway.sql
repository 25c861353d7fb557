-- contract
-- (contract: drops the index sessions_gateway_idx, replaced by a wider one.)
-- 0006_sessions_by_gateway: every gateway reads back the ids of the
-- sessions it holds every few seconds, to close those superseded on another
-- gateway (docs/gateway.md). With both columns in the index that read is an
-- index-only scan; the heartbeat batch finds its rows through it too.
DROP INDEX sessions_gateway_idx;
CREATE INDEX sessions_gateway_session_idx ON sessions (gateway_id, session_id);
