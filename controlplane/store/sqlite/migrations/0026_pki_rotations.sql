-- expand
-- 0024_pki_rotations: node-CA rotation in phases (issue 34, DESIGN.md "CA
-- rotation"; docs/pki.md "Rotating the node CA"). A rotation of ca ('node')
-- moves propagating -> activated -> retired, or to rolled-back from either
-- of the first two; old_ca_id and new_ca_id are the CA certificates'
-- serials (pki.NodeCAID). threshold is the share of live nodes (0 to 1)
-- whose ack activates it. At most one rotation per CA is open
-- (propagating or activated). pki_rotation_acks holds one row per node that
-- acknowledged the rotation's bundle.
CREATE TABLE pki_rotations (
    id             text PRIMARY KEY,
    ca             text NOT NULL,
    phase          text NOT NULL,
    old_ca_id      text NOT NULL,
    new_ca_id      text NOT NULL,
    threshold      real NOT NULL CHECK (threshold > 0 AND threshold <= 1),
    started_by     text NOT NULL DEFAULT '',
    started_at     integer NOT NULL,
    activated_at   integer,
    retired_at     integer,
    rolled_back_at integer,
    updated_at     integer NOT NULL
);
CREATE UNIQUE INDEX pki_rotations_open_idx ON pki_rotations (ca) WHERE phase IN ('propagating', 'activated');
CREATE INDEX pki_rotations_ca_idx ON pki_rotations (ca, started_at);

CREATE TABLE pki_rotation_acks (
    rotation_id text NOT NULL REFERENCES pki_rotations (id) ON DELETE CASCADE,
    node_id     text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    acked_at    integer NOT NULL,
    PRIMARY KEY (rotation_id, node_id)
);

-- cert_ca_id is the id of the node CA that issued the node's latest
-- certificate (pki.NodeCAID), '' when written by a build before this one: a
-- rotation retires its old CA once no node's live certificate is from
-- another CA than the new one.
ALTER TABLE nodes ADD COLUMN cert_ca_id text NOT NULL DEFAULT '';
