-- One acquire and one release, each one plain statement on fencelock's own tables (a
-- database set up by `fencelock migrate`): the lease row and its history row written
-- together, as the contract needs, without the rest of `fencelock_apply`'s rules (the
-- waiting line, lock delays, deadlines, takeovers' history). One cycle per transaction pair.
\set r random(1, 10000)
\set o random(1, 1000000000)
WITH l AS (INSERT INTO leases AS l (resource, owner, fence, acquired_at, expires_at) VALUES ('res:' || :r, 'o' || :o, nextval('lease_fence'), now(), now() + interval '30 seconds') ON CONFLICT (resource) DO UPDATE SET owner = EXCLUDED.owner, fence = EXCLUDED.fence, acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at WHERE l.expires_at <= now() OR l.owner = EXCLUDED.owner RETURNING l.fence, l.resource, l.acquired_at, l.expires_at) INSERT INTO lease_history (fence, resource, acquired_at, expires_at) SELECT * FROM l RETURNING fence;
WITH d AS (DELETE FROM leases WHERE resource = 'res:' || :r AND owner = 'o' || :o RETURNING fence) UPDATE lease_history h SET end_kind = 'released', ended_at = now() FROM d WHERE h.fence = d.fence;
