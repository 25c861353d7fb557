-- expand
-- 0009_events_dead_letters (issue 18): every state change writes a
-- CloudEvents envelope to the outbox; each sink moves an entry it keeps
-- failing to deliver (sinks.Config.MaxAttempts) to sink_dead_letters, where
-- it no longer blocks later entries and waits for sinks.replay. A row keeps
-- the entry as it was, so the outbox's retention does not lose it.
CREATE TABLE sink_dead_letters (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sink       text NOT NULL,
    outbox_id  bigint NOT NULL,
    topic      text NOT NULL,
    key        text NOT NULL DEFAULT '',
    payload    jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    attempts   integer NOT NULL,
    last_error text NOT NULL DEFAULT '',
    replay     boolean NOT NULL DEFAULT false,
    failed_at  timestamptz NOT NULL,
    UNIQUE (sink, outbox_id)
);
CREATE INDEX sink_dead_letters_replay_idx ON sink_dead_letters (sink, id) WHERE replay;

-- join-token.expired is written once per token (store.JoinTokensExpire).
ALTER TABLE join_tokens ADD COLUMN expiry_reported boolean NOT NULL DEFAULT false;
-- Tokens that expired before this build are not reported.
UPDATE join_tokens SET expiry_reported = true WHERE expires_at <= now();
