-- One acquire and one release, each one plain statement on fencelock's own tables (a
-- database set up by `fencelock migrate`): the rows the contract needs and nothing else. The
-- acquisition appends the resource's new lease row (its own history row) unless a current one
-- exists; the release ends the current row. No waiting line, lock delay, quota, deadline or
-- takeover: what the rows alone cost the database. The benchmark sets the database's
-- `fencelock.announcing` to 'inline', as `fencelock_apply` sets it for its own writes, so that
-- the trigger announcing other writers' changes is skipped here as it is for the store's.
\set r random(1, 10000)
\set o random(1, 1000000000)
INSERT INTO leases (resource, fence, owner, acquired_at, expires_at) VALUES ('res:' || :r, nextval('lease_fence'), 'o' || :o, now(), now() + interval '30 seconds') ON CONFLICT (resource) WHERE ended_at IS NULL DO NOTHING RETURNING fence;
UPDATE leases SET ended_at = now(), end_kind = 'released' WHERE resource = 'res:' || :r AND ended_at IS NULL AND owner = 'o' || :o RETURNING fence;
