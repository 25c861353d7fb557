-- expand
-- 0029_release_pins: release pins that reach every node (issue 35 item 2;
-- docs/releases.md "Pin statements"). release_pin_statements holds each
-- signed pin statement (installer/manifest/pinstatement.go) accepted by
-- release.pinsAdd or release.pinsRemove, verified against the deployment's
-- pins; gateways send them all to every node that offers the release.pins
-- capability. node_release_pins holds the pins each node last reported it
-- holds in its pin file, one row per pin.
CREATE TABLE release_pin_statements (
    id          text PRIMARY KEY,
    action      text NOT NULL CHECK (action IN ('add', 'remove')),
    pin         text NOT NULL,
    statement   blob NOT NULL,
    signature   blob NOT NULL,
    signed_at   integer NOT NULL,
    added_by    text NOT NULL DEFAULT '',
    added_at    integer NOT NULL
);
CREATE INDEX release_pin_statements_added_idx ON release_pin_statements (added_at, id);

CREATE TABLE node_release_pins (
    node_id     text NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    pin         text NOT NULL,
    reported_at integer NOT NULL,
    PRIMARY KEY (node_id, pin)
);
