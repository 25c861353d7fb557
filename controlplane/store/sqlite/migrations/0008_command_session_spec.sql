-- expand
-- 0008_command_session_spec: the expand step of moving a command's spec to
-- its session-protocol form (issue 17). session_spec holds the protojson of a
-- bettercompute.session.v1.Command with only its spec set
-- (sessionv1.MarshalSpec: {"exec":{...}}, {"power":{"bmc":"","action":"cycle"}},
-- {} for kinds without a spec); the API fills it at enqueue and the gateway
-- sends it as it is. The old column spec (the API's ExecSpec, PowerSpec,
-- BootSpec or UpgradeSpec as JSON) is still written, so that a gateway of an
-- older build still dispatches during a rolling deploy; rows an older API
-- writes after this migration have no session_spec and are read with a
-- fallback from spec (store/internal/queries, legacySessionSpec). The
-- contract step, a later migration, drops spec once no older build runs.
--
-- Every row already stored is converted here.
ALTER TABLE commands ADD COLUMN session_spec text;
UPDATE commands SET session_spec = CASE
    WHEN kind = 'exec' THEN json_object('exec', json(spec))
    WHEN kind IN ('power.status', 'power.on', 'power.off', 'power.soft-off', 'power.cycle', 'power.reset')
        THEN json_object('power', json_set(json(spec), '$.action', substr(kind, 7)))
    WHEN kind = 'boot.set' THEN json_object('boot', json(spec))
    WHEN kind = 'upgrade' THEN json_object('upgrade', json(spec))
    ELSE '{}'
END;
