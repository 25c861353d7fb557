-- expand
-- 0017_reconnect_by: a node drained by a gateway that shuts down waits a
-- random delay, up to the gateway's drainDelay, before it reconnects (issue
-- 29). The gateway records by when each of its nodes is due back, and
-- liveness counts that time as heard from: a node waiting out its delay is
-- not silent, so no remediation case opens for it. NULL: never drained.
ALTER TABLE nodes ADD COLUMN reconnect_by integer;
