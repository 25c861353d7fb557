-- expand
-- 0023_api_token_expiry_warned (expand: adds a column, drops nothing; issue
-- 35, "Every lifetime watched", docs/events.md). expiry_warned is set when
-- the iam role wrote token.expiring for the API token (7 days before its
-- expiry), so that each token is warned about once.
ALTER TABLE api_tokens ADD COLUMN expiry_warned integer NOT NULL DEFAULT 0;
