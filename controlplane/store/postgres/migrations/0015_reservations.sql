-- expand
-- 0015_reservations: reservations of GPU capacity and the slots they hold
-- (DESIGN.md, "Scheduler: reservations and the capacity placer";
-- docs/reservations.md). A reservation asks for gpus GPUs or nodes whole
-- nodes of a pool for [starts_at, ends_at); the placer (capacity.placer)
-- gives it slots: one row per GPU it holds (a whole node holds every GPU of
-- the node, one row each). No GPU is ever booked twice for overlapping
-- time: the exclusion constraint below refuses it, whatever writes.
--
-- A slot is never deleted while its reservation lives: releasing it
-- (cancel, end, a move to another node before the start) shortens its
-- range to what was held (an empty range, starts_at = ends_at, when it was
-- never used), so the table is the whole booking history and the
-- constraint covers all of it.
--
-- btree_gist gives text and integer the GiST equality the constraint
-- needs. It is made once per database, in the public schema when there is
-- one (else the current schema): a default operator class is found
-- whatever the search_path, and a schema dropped later (a test's) must not
-- take the extension, and every other schema's constraint, with it. The
-- exception handler lets two schemas migrated at once both succeed.
-- doctor checks that it is there (check database.btree-gist).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'btree_gist') THEN
        IF EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'public') THEN
            CREATE EXTENSION IF NOT EXISTS btree_gist SCHEMA public;
        ELSE
            CREATE EXTENSION IF NOT EXISTS btree_gist;
        END IF;
    END IF;
EXCEPTION WHEN unique_violation OR duplicate_object THEN
    NULL;
END
$$;

CREATE TABLE reservations (
    id                 text PRIMARY KEY,
    pool_id            text NOT NULL REFERENCES pools (id),
    gpus               integer NOT NULL DEFAULT 0 CHECK (gpus >= 0),
    nodes              integer NOT NULL DEFAULT 0 CHECK (nodes >= 0),
    gpu_model          text NOT NULL DEFAULT '',
    min_gpu_memory_mib bigint NOT NULL DEFAULT 0,
    selector           jsonb NOT NULL DEFAULT '{}',
    starts_at          timestamptz NOT NULL,
    ends_at            timestamptz NOT NULL,
    owner              text NOT NULL,
    note               text NOT NULL DEFAULT '',
    state              text NOT NULL,
    reason             text NOT NULL DEFAULT '',
    created_by         text NOT NULL DEFAULT '',
    failed_nodes       jsonb NOT NULL DEFAULT '[]',
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    CHECK (ends_at > starts_at),
    CHECK ((gpus > 0) <> (nodes > 0))
);
CREATE INDEX reservations_pool_idx ON reservations (pool_id, id);
CREATE INDEX reservations_open_idx ON reservations (pool_id, state) WHERE state IN ('pending', 'placed', 'active');

CREATE TABLE reservation_slots (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reservation_id text NOT NULL REFERENCES reservations (id) ON DELETE CASCADE,
    pool_id        text NOT NULL,
    node_id        text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    gpu            integer NOT NULL,
    gpu_uuid       text NOT NULL DEFAULT '',
    starts_at      timestamptz NOT NULL,
    ends_at        timestamptz NOT NULL,
    CHECK (ends_at >= starts_at),
    CONSTRAINT reservation_slots_no_double_booking
        EXCLUDE USING gist (node_id WITH =, gpu WITH =, tstzrange(starts_at, ends_at) WITH &&)
);
CREATE INDEX reservation_slots_reservation_idx ON reservation_slots (reservation_id);
CREATE INDEX reservation_slots_pool_idx ON reservation_slots (pool_id, ends_at);
CREATE INDEX reservation_slots_node_idx ON reservation_slots (node_id, gpu, ends_at);
-- capacity.summary over every pool: the slots of a window by their range.
CREATE INDEX reservation_slots_during_idx ON reservation_slots USING gist (tstzrange(starts_at, ends_at));
