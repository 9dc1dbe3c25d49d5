-- apply_1.sql in batches of four: four acquisitions in one call of `fencelock_apply`, then
-- their four releases in another.
\set r1 random(1000, 3249)
\set r2 random(3250, 5499)
\set r3 random(5500, 7749)
\set r4 random(7750, 9999)
\set o random(1, 1000000000)
SELECT * FROM fencelock_apply(ARRAY['acquire', 'acquire', 'acquire', 'acquire'], ARRAY['res:' || :r1, 'res:' || :r2, 'res:' || :r3, 'res:' || :r4], ARRAY['o' || :o, 'o' || :o, 'o' || :o, 'o' || :o], ARRAY[30, 30, 30, 30], ARRAY[NULL::bigint, NULL, NULL, NULL], ARRAY[NULL::text, NULL, NULL, NULL], ARRAY[NULL::int, NULL, NULL, NULL], ARRAY[NULL::bigint, NULL, NULL, NULL], ARRAY[0, 0, 0, 0], ARRAY[now() + interval '5 s', now() + interval '5 s', now() + interval '5 s', now() + interval '5 s'], 1000);
SELECT * FROM fencelock_apply(ARRAY['release', 'release', 'release', 'release'], ARRAY['res:' || :r1, 'res:' || :r2, 'res:' || :r3, 'res:' || :r4], ARRAY['o' || :o, 'o' || :o, 'o' || :o, 'o' || :o], ARRAY[NULL::int, NULL, NULL, NULL], ARRAY[NULL::bigint, NULL, NULL, NULL], ARRAY[NULL::text, NULL, NULL, NULL], ARRAY[NULL::int, NULL, NULL, NULL], ARRAY[NULL::bigint, NULL, NULL, NULL], ARRAY[NULL::int, NULL, NULL, NULL], ARRAY[now() + interval '5 s', now() + interval '5 s', now() + interval '5 s', now() + interval '5 s'], 1000);
