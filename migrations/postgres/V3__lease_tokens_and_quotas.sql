-- fencelock: each lease records the bearer token that took it (`--auth-file`), and a token's
-- `max_leases` quota is kept by the acquire decision itself, so that every instance sharing
-- this database counts the same leases.

-- The token's name, never its secret; NULL for a lease taken without a token.
ALTER TABLE leases ADD COLUMN token text;

-- A token's live leases: a range scan of its own rows only.
CREATE INDEX leases_token_expires_at_idx ON leases (token, expires_at) WHERE token IS NOT NULL;

-- Acquire, as in V2, with the token recorded on the lease and its quota checked in the same
-- transaction as the grant.
--
-- With a quota (`p_max_leases` not NULL), acquisitions by one token are serialised by a
-- transaction-scoped advisory lock on the token's name, taken before any row lock (so the
-- order is always token, then resource, and two acquisitions cannot wait on each other).
-- Without it two acquisitions of different resources could each count the other's lease as
-- not yet there and both be granted past the quota. The count leaves out `p_resource`
-- itself: re-acquiring a lease the token holds never counts twice.
--
-- Returns no row when a live lease of another owner holds the resource; one row with `how`
-- 'quota_exceeded' (and no fence) when the token is at its quota; otherwise one row, whose
-- `how` names the event: 'fresh', 'reacquired' or 'taken_over'.
CREATE FUNCTION fencelock_acquire(
    p_resource text, p_owner text, p_ttl_seconds integer, p_deadline timestamptz,
    p_token text, p_max_leases integer
) RETURNS TABLE (
    fence bigint, acquired_at timestamptz, expires_at timestamptz, observed_at timestamptz,
    how text
)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    stamp constant timestamptz := date_trunc('milliseconds', now());
    ends constant timestamptz := stamp + p_ttl_seconds * interval '1 second';
    held_by text;
    held_until timestamptz;
    granted bigint;
    others bigint;
BEGIN
    IF p_token IS NOT NULL AND p_max_leases IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('fencelock.token:' || p_token, 0));
        SELECT count(*) INTO others FROM leases l
        WHERE l.token = p_token AND l.expires_at > now() AND l.resource <> p_resource;
        IF others >= p_max_leases THEN
            RETURN QUERY SELECT NULL::bigint, NULL::timestamptz, NULL::timestamptz, now(),
                'quota_exceeded'::text;
            RETURN;
        END IF;
    END IF;
    LOOP
        SELECT l.owner, l.expires_at INTO held_by, held_until
        FROM leases l WHERE l.resource = p_resource FOR UPDATE;
        IF FOUND THEN
            IF held_until > now() AND held_by <> p_owner THEN
                RETURN;
            END IF;
            PERFORM fencelock_in_time(p_deadline);
            UPDATE leases l
            SET owner = p_owner, fence = nextval('lease_fence'), acquired_at = stamp,
                expires_at = ends, token = p_token
            WHERE l.resource = p_resource
            RETURNING l.fence INTO granted;
            RETURN QUERY SELECT granted, stamp, ends, now(),
                CASE WHEN held_until > now() THEN 'reacquired' ELSE 'taken_over' END;
            RETURN;
        END IF;
        PERFORM fencelock_in_time(p_deadline);
        INSERT INTO leases AS l (resource, owner, fence, acquired_at, expires_at, token)
        VALUES (p_resource, p_owner, nextval('lease_fence'), stamp, ends, p_token)
        ON CONFLICT (resource) DO NOTHING
        RETURNING l.fence INTO granted;
        IF FOUND THEN
            RETURN QUERY SELECT granted, stamp, ends, now(), 'fresh'::text;
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- The four-argument form stays for instances of the previous build during a rolling
-- upgrade; it now takes leases without a token, so a lease it re-grants no longer names the
-- token of the lease it replaced.
CREATE OR REPLACE FUNCTION fencelock_acquire(
    p_resource text, p_owner text, p_ttl_seconds integer, p_deadline timestamptz
) RETURNS TABLE (
    fence bigint, acquired_at timestamptz, expires_at timestamptz, observed_at timestamptz,
    how text
)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM fencelock_acquire(p_resource, p_owner, p_ttl_seconds, p_deadline,
                                    NULL::text, NULL::integer)
$$;
