-- expand
-- 0027_reservation_grants (expand: adds columns, drops nothing; issue 48,
-- "Access from reservations", docs/reservations.md). tenant_id is the
-- reservation's holder (the tenant its grants go to; root for the
-- reservations made before); grants the rights it gives the holder's
-- operators on exactly its nodes for exactly its window: a sorted,
-- comma-joined subset of shell, port-forward, exec ('' for none).
ALTER TABLE reservations ADD COLUMN tenant_id text NOT NULL DEFAULT 'root';
ALTER TABLE reservations ADD COLUMN grants text NOT NULL DEFAULT '';
