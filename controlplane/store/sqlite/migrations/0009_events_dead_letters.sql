-- expand
-- 0009_events_dead_letters (issue 18): every state change writes a
-- CloudEvents envelope to the outbox; each sink moves an entry it keeps
-- failing to deliver (sinks.Config.MaxAttempts) to sink_dead_letters, where
-- it no longer blocks later entries and waits for sinks.replay. A row keeps
-- the entry as it was, so the outbox's retention does not lose it.
CREATE TABLE sink_dead_letters (
    id         integer PRIMARY KEY AUTOINCREMENT,
    sink       text NOT NULL,
    outbox_id  integer NOT NULL,
    topic      text NOT NULL,
    key        text NOT NULL DEFAULT '',
    payload    text NOT NULL,
    created_at integer NOT NULL,
    attempts   integer NOT NULL,
    last_error text NOT NULL DEFAULT '',
    replay     integer NOT NULL DEFAULT 0,
    failed_at  integer NOT NULL,
    UNIQUE (sink, outbox_id)
);
CREATE INDEX sink_dead_letters_replay_idx ON sink_dead_letters (sink, id) WHERE replay;

-- join-token.expired is written once per token (store.JoinTokensExpire).
ALTER TABLE join_tokens ADD COLUMN expiry_reported integer NOT NULL DEFAULT 0;
-- Tokens that expired before this build are not reported.
UPDATE join_tokens SET expiry_reported = 1 WHERE expires_at <= now();
