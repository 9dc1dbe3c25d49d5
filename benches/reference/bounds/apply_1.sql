-- One acquire and one release, each one call of `fencelock_apply` with one request: what a
-- batch of one costs the database (a database set up by `fencelock migrate`).
\set r random(1, 10000)
\set o random(1, 1000000000)
SELECT * FROM fencelock_apply(ARRAY['acquire'], ARRAY['res:' || :r], ARRAY['o' || :o], ARRAY[30], ARRAY[NULL::bigint], ARRAY[NULL::text], ARRAY[NULL::int], ARRAY[NULL::bigint], ARRAY[0], ARRAY[now() + interval '5 s'], 1000);
SELECT * FROM fencelock_apply(ARRAY['release'], ARRAY['res:' || :r], ARRAY['o' || :o], ARRAY[NULL::int], ARRAY[NULL::bigint], ARRAY[NULL::text], ARRAY[NULL::int], ARRAY[NULL::bigint], ARRAY[NULL::int], ARRAY[now() + interval '5 s'], 1000);
