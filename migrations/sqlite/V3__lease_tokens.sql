-- fencelock embedded store: each lease records the bearer token that took it
-- (`--auth-file`), so that a token's `max_leases` quota is counted in the same write
-- transaction as the grant. The token's name, never its secret; NULL without a token.
ALTER TABLE leases ADD COLUMN token TEXT;

-- A token's live leases: a range scan of its own rows only.
CREATE INDEX leases_token_expires_at_idx ON leases (token, expires_at) WHERE token IS NOT NULL;
