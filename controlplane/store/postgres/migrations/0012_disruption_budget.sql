-- expand
-- 0012_disruption_budget: the one disruption budget of a pool (DESIGN.md,
-- "The disruption budget"). A pool's budget is "N" nodes or "N%" of its
-- nodes (at least one) out of service at once; remediation_concurrency caps
-- the remediation actions (reset, reboot, power cycle) running at once on
-- its quarantined nodes. A node's disruption is why it is out of service
-- ('' in service; quarantined, draining, remediating, verifying,
-- upgrading), disruption_owner who holds that slot ("rollout:<id>",
-- "remediation:<id>", "operator:<actor>"). The partial index serves the
-- count an admission makes under the pool's row lock.
ALTER TABLE pools ADD COLUMN disruption_budget text NOT NULL DEFAULT '10%';
ALTER TABLE pools ADD COLUMN remediation_concurrency integer NOT NULL DEFAULT 2
    CHECK (remediation_concurrency >= 1);
ALTER TABLE nodes ADD COLUMN disruption text NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN disruption_owner text NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN disruption_since timestamptz;
CREATE INDEX nodes_pool_disruption_idx ON nodes (pool_id, disruption) WHERE disruption <> '';
