-- The fencelock write guard in a protected service's own PostgreSQL database (11 or later;
-- no extension). A service in any language protects a write by one call in the write's
-- own transaction, before the write:
--
--     SELECT fencelock_guard.admit(key, token);
--
-- It returns the token's fence when that fence is >= the highest admitted for `key` (and
-- records it), holding the key's row locked until the transaction ends, so that the check
-- and the write are one atomic step. Refusals are errors, by SQLSTATE: FL409 stale (DETAIL
-- holds the current fence, in decimal), FL403 not signed by an installed key for `key` (or
-- a bare fence once keys are installed), FL400 not a fence token at all (with keys or
-- without). Idempotent: safe to apply again, by the same role.

DO $begin$
BEGIN
    IF current_setting('server_version_num')::int < 110000 THEN
        RAISE EXCEPTION 'the fencelock guard needs PostgreSQL 11 or later (for sha256())';
    END IF;
    -- Two sessions applying this at once would trip over each other's catalog rows.
    PERFORM pg_advisory_xact_lock(hashtextextended('fencelock_guard', 0));
END
$begin$;

CREATE SCHEMA IF NOT EXISTS fencelock_guard;

-- The highest fence admitted per key. A row is never deleted: without it, a writer whose
-- lease has passed would be admitted again.
CREATE TABLE IF NOT EXISTS fencelock_guard.fences (
    key        text        NOT NULL,
    fence      bigint      NOT NULL CHECK (fence > 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT fences_pkey PRIMARY KEY (key)
);

-- The secrets that sign fence tokens, shared with the lease server's --fence-key. None:
-- `admit` takes bare fences. Readable by the owner alone (see the grants below).
CREATE TABLE IF NOT EXISTS fencelock_guard.fence_keys (
    secret   bytea       PRIMARY KEY CHECK (octet_length(secret) >= 32),
    added_at timestamptz NOT NULL DEFAULT now()
);

-- The highest fences of the table an earlier version of the Rust guard kept, `fence_guard`
-- in the installing role's search path, carried over so that an upgrade admits no writer
-- those fences had stopped. The old table is left as it is.
DO $carry_over$
DECLARE
    old regclass := to_regclass('fence_guard');
BEGIN
    IF old IS NOT NULL THEN
        EXECUTE format(
            'INSERT INTO fencelock_guard.fences AS f (key, fence, updated_at)
             SELECT key, fence, updated_at FROM %s
             ON CONFLICT (key) DO UPDATE SET fence = EXCLUDED.fence, updated_at = EXCLUDED.updated_at
                 WHERE f.fence < EXCLUDED.fence',
            old);
    END IF;
END
$carry_over$;

-- HMAC-SHA256 (RFC 2104) on PostgreSQL's own sha256(), so that no extension is needed. The
-- key, zero-padded to SHA-256's 64-byte block, is XORed with each pad as a bit string, whose
-- bytes varbit_send() gives after their 4-byte length.
CREATE OR REPLACE FUNCTION fencelock_guard.hmac_sha256(secret bytea, message bytea)
    RETURNS bytea
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $hmac$
DECLARE
    block bit(512) := ('x' || rpad(encode(CASE WHEN octet_length(secret) > 64 THEN sha256(secret)
                                               ELSE secret END, 'hex'), 128, '0'))::bit(512);
BEGIN
    RETURN sha256(substr(varbit_send(block # ('x' || repeat('5c', 64))::bit(512)), 5)
                  || sha256(substr(varbit_send(block # ('x' || repeat('36', 64))::bit(512)), 5)
                            || message));
END
$hmac$;

-- The fence `token` may write to `key` with, by the Rust guard's rules (`Guard::check`):
-- what is neither a bare fence nor a well-formed `<fence>.<signature>` is no token at all,
-- FL400, with keys or without. With keys installed, only a token one of them signed,
-- `key || E'\n' || fence` (every key is tried, and signatures are compared in constant
-- time), passes; a bare fence or a token none of them signed for `key` (forged, another
-- key's, tampered) is FL403. Without keys, a bare fence or the fence of a well-formed token,
-- unverified. A fence is written in canonical decimal (no sign, no leading zero) and is
-- below 2^53; a signature is 43 characters of unpadded base64url.
CREATE OR REPLACE FUNCTION fencelock_guard.fence_of(key text, token text)
    RETURNS bigint
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
AS $fence_of$
DECLARE
    dot        int := strpos(token, '.');
    fence_text text := CASE WHEN dot = 0 THEN token ELSE left(token, dot - 1) END;
    signature  text := CASE WHEN dot > 0 THEN substr(token, dot + 1) END;
    fence      bigint;
    signed     boolean := false;
    keyed      boolean := false;
    matched    boolean := false;
    secret     bytea;
    expected   text;
    shown      text := coalesce(quote_literal(left(token, 80)), 'NULL');
BEGIN
    -- Plain checks, one after the other: a regular expression with groups or counted
    -- repeats costs PostgreSQL a hundred times more than these.
    IF fence_text ~ '^[1-9][0-9]*$' AND length(fence_text) <= 16 THEN
        IF fence_text::bigint <= 9007199254740991 THEN
            fence := fence_text::bigint;
        END IF;
    END IF;
    IF length(signature) = 43 AND signature ~ '^[A-Za-z0-9_-]*[AEIMQUYcgkosw048]$' THEN
        signed := true;
    ELSIF signature IS NOT NULL THEN
        fence := NULL;
    END IF;
    -- No token at all, whether or not keys are installed.
    IF fence IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'FL400',
            MESSAGE = format('not a fence token: %s (a fence is a positive integer below 2^53 in plain decimal; a token is <fence>.<signature>)', shown);
    END IF;
    FOR secret IN SELECT k.secret FROM fencelock_guard.fence_keys AS k LOOP
        keyed := true;
        IF fence IS NOT NULL AND signed THEN
            expected := rtrim(translate(encode(fencelock_guard.hmac_sha256(secret,
                convert_to(key || E'\n' || fence_text, 'UTF8')), 'base64'), '+/', '-_'), '=');
            -- Compared through a keyed hash, so that how long `=` takes tells nothing of how
            -- much of the signature is right.
            matched := matched OR sha256(secret || convert_to(expected, 'UTF8'))
                                = sha256(secret || convert_to(signature, 'UTF8'));
        END IF;
    END LOOP;
    IF keyed AND NOT matched THEN
        RAISE EXCEPTION USING ERRCODE = 'FL403',
            MESSAGE = format('fence token %s refused for key %s: %s', shown, quote_literal(key),
                CASE WHEN NOT signed
                     THEN 'a bare fence is not accepted once keys are installed; send the lease''s fence_token'
                     ELSE 'not signed by an installed key for this key' END);
    END IF;
    RETURN fence;
END
$fence_of$;

-- Admits `token`'s fence for `key` if it is at least the highest admitted so far, and
-- records it; returns the fence. On a conflict the key's row is locked even when the
-- condition fails, so the follow-up read sees the fence that beat this one, and no other
-- admit of `key` gets in before the caller's transaction ends.
CREATE OR REPLACE FUNCTION fencelock_guard.admit(key text, token text)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $admit$
DECLARE
    wanted   bigint;
    admitted bigint;
    highest  bigint;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'FL400', MESSAGE = 'the key of fencelock_guard.admit must not be NULL';
    END IF;
    wanted := fencelock_guard.fence_of(key, token);
    -- The constraint, not `(key)`, which PL/pgSQL would take for the parameter.
    INSERT INTO fencelock_guard.fences AS f (key, fence) VALUES (admit.key, wanted)
    ON CONFLICT ON CONSTRAINT fences_pkey DO UPDATE SET fence = EXCLUDED.fence, updated_at = now()
        WHERE f.fence <= EXCLUDED.fence
    RETURNING f.fence INTO admitted;
    IF admitted IS NULL THEN
        SELECT f.fence INTO highest FROM fencelock_guard.fences AS f WHERE f.key = admit.key;
        RAISE EXCEPTION USING ERRCODE = 'FL409',
            MESSAGE = format('stale fence %s: the current fence is %s, for key %s', wanted, highest, quote_literal(key)),
            DETAIL = highest::text,
            HINT = 'A newer holder of the lease has written: write nothing, and roll back.';
    END IF;
    RETURN admitted;
END
$admit$;

-- Any role may call `admit` (which runs as the owner); no role but the owner reads the keys
-- or changes the fences directly. A grant on the keys that another role was given since
-- (by hand, or by default privileges) is taken back.
REVOKE ALL ON SCHEMA fencelock_guard FROM PUBLIC;
GRANT USAGE ON SCHEMA fencelock_guard TO PUBLIC;
REVOKE ALL ON TABLE fencelock_guard.fences, fencelock_guard.fence_keys FROM PUBLIC;
REVOKE ALL ON FUNCTION fencelock_guard.hmac_sha256(bytea, bytea) FROM PUBLIC;
REVOKE ALL ON FUNCTION fencelock_guard.fence_of(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencelock_guard.admit(text, text) TO PUBLIC;
DO $owner_only$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole::text
        FROM pg_class AS c, aclexplode(c.relacl) AS a
        WHERE c.oid = 'fencelock_guard.fence_keys'::regclass
          AND a.grantee NOT IN (0, c.relowner)
    LOOP
        EXECUTE format('REVOKE ALL ON TABLE fencelock_guard.fence_keys FROM %s', grantee);
    END LOOP;
END
$owner_only$;
