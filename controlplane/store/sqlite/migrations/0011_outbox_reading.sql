-- expand
-- 0011_outbox_reading: reading the outbox as events (issue 18, events.list
-- and GET {basePath}/events/watch). outbox_pruned records the highest id
-- retention has deleted (OutboxPrune deletes a prefix of ids), so that a
-- reader resuming after an id at or below it gets an explicit gap error
-- instead of silently skipping what was pruned; ids are never reused, and
-- an id missing above it is one whose transaction rolled back. The index
-- serves events.list's subject filter.
CREATE TABLE outbox_pruned (
    id         integer PRIMARY KEY CHECK (id = 1),
    through_id bigint NOT NULL
);
CREATE INDEX outbox_key_id ON outbox (key, id);
