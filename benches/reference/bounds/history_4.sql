-- history_1.sql in batches of four: four acquisitions in one statement, then their four
-- releases in another (four cycles per transaction pair). The resources are drawn from four
-- disjoint ranges and taken in order, as a batch takes its rows.
\set r1 random(1000, 3249)
\set r2 random(3250, 5499)
\set r3 random(5500, 7749)
\set r4 random(7750, 9999)
\set o random(1, 1000000000)
WITH u AS (SELECT r COLLATE "C" AS r, 'o' || :o || r AS o FROM unnest(ARRAY['res:' || :r1, 'res:' || :r2, 'res:' || :r3, 'res:' || :r4]) r ORDER BY 1), l AS (INSERT INTO leases AS l (resource, owner, fence, acquired_at, expires_at) SELECT r, o, nextval('lease_fence'), now(), now() + interval '30 seconds' FROM u ON CONFLICT (resource) DO UPDATE SET owner = EXCLUDED.owner, fence = EXCLUDED.fence, acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at WHERE l.expires_at <= now() OR l.owner = EXCLUDED.owner RETURNING l.fence, l.resource, l.acquired_at, l.expires_at) INSERT INTO lease_history (fence, resource, acquired_at, expires_at) SELECT * FROM l RETURNING fence;
WITH u AS (SELECT r COLLATE "C" AS r, 'o' || :o || r AS o FROM unnest(ARRAY['res:' || :r1, 'res:' || :r2, 'res:' || :r3, 'res:' || :r4]) r), d AS (DELETE FROM leases l USING u WHERE l.resource = u.r AND l.owner = u.o RETURNING l.fence) UPDATE lease_history h SET end_kind = 'released', ended_at = now() FROM d WHERE h.fence = d.fence;
