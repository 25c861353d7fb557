-- expand
-- 0015_reservations: reservations of GPU capacity and the slots they hold
-- (DESIGN.md, "Scheduler: reservations and the capacity placer";
-- docs/reservations.md). The same tables as PostgreSQL's 0015; SQLite has
-- no exclusion constraint, so the store checks for an overlapping slot in
-- the write transaction that inserts or lengthens one (SQLite runs one
-- writer at a time, so the check and the write see the same table).
-- Released slots keep what was held (an empty range when nothing was).
CREATE TABLE reservations (
    id                 text PRIMARY KEY,
    pool_id            text NOT NULL REFERENCES pools (id),
    gpus               integer NOT NULL DEFAULT 0 CHECK (gpus >= 0),
    nodes              integer NOT NULL DEFAULT 0 CHECK (nodes >= 0),
    gpu_model          text NOT NULL DEFAULT '',
    min_gpu_memory_mib integer NOT NULL DEFAULT 0,
    selector           text NOT NULL DEFAULT '{}',
    starts_at          integer NOT NULL,
    ends_at            integer NOT NULL,
    owner              text NOT NULL,
    note               text NOT NULL DEFAULT '',
    state              text NOT NULL,
    reason             text NOT NULL DEFAULT '',
    created_by         text NOT NULL DEFAULT '',
    failed_nodes       text NOT NULL DEFAULT '[]',
    created_at         integer NOT NULL,
    updated_at         integer NOT NULL,
    CHECK (ends_at > starts_at),
    CHECK ((gpus > 0) <> (nodes > 0))
);
CREATE INDEX reservations_pool_idx ON reservations (pool_id, id);
CREATE INDEX reservations_open_idx ON reservations (pool_id, state) WHERE state IN ('pending', 'placed', 'active');

CREATE TABLE reservation_slots (
    id             integer PRIMARY KEY AUTOINCREMENT,
    reservation_id text NOT NULL REFERENCES reservations (id) ON DELETE CASCADE,
    pool_id        text NOT NULL,
    node_id        text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    gpu            integer NOT NULL,
    gpu_uuid       text NOT NULL DEFAULT '',
    starts_at      integer NOT NULL,
    ends_at        integer NOT NULL,
    CHECK (ends_at >= starts_at)
);
CREATE INDEX reservation_slots_reservation_idx ON reservation_slots (reservation_id);
CREATE INDEX reservation_slots_pool_idx ON reservation_slots (pool_id, ends_at);
CREATE INDEX reservation_slots_node_idx ON reservation_slots (node_id, gpu, ends_at);
