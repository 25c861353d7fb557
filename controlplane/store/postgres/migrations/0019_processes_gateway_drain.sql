-- expand
-- 0019_processes_gateway_drain (expand: adds a table and a column, drops
-- nothing; issue 40).
--
-- processes: every control-plane process registers here, whatever its roles
-- (api-only and sinks,iam ones included), with its build version and the
-- newest migration its build knows (schema), and heartbeats the row; rows
-- not heard from for the prune timeout are deleted by any live process.
-- `processes list` and doctor read it to tell which builds still run.
CREATE TABLE processes (
    id           text PRIMARY KEY,
    roles        text NOT NULL DEFAULT '',
    hostname     text NOT NULL DEFAULT '',
    pid          integer NOT NULL DEFAULT 0,
    version      text NOT NULL DEFAULT '',
    schema       text NOT NULL DEFAULT '',
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL
);
CREATE INDEX processes_heartbeat_at ON processes (heartbeat_at);

-- gateways.drain_requested: an operator asked the gateway to drain
-- (gateways.drain) and not yet to undrain. Only the API writes it; the
-- gateway reads it back with every refresh of its row.
ALTER TABLE gateways ADD COLUMN drain_requested boolean NOT NULL DEFAULT false;
