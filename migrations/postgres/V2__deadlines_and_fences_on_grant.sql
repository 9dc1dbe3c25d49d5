-- fencelock: requests carry their deadline into the database, fences are issued only for
-- acquisitions that happen, and a probe row lets readiness check that the database accepts
-- writes.

-- Raises `FL408` once the request's deadline (on this database's clock) has passed.
--
-- A request answered `503` must not take effect later. `statement_timeout` cannot promise
-- that: it starts when a statement reaches the server, and a statement held up in a network
-- partition arrives whole, long after its client gave up. Every write calls this right
-- before it writes, after any row lock it waited for.
CREATE FUNCTION fencelock_in_time(deadline timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF clock_timestamp() >= deadline THEN
        RAISE EXCEPTION 'the request''s deadline passed before the database acted on it'
            USING ERRCODE = 'FL408';
    END IF;
    RETURN true;
END
$$;

-- Acquire: the decision and the write in one transaction, with a fence drawn from the
-- sequence only when the lease is granted (a refusal costs no fence and no sequence write).
--
-- The existing row is locked before anything is decided, and `nextval()` runs after that
-- lock, so a fence issued for a resource is always greater than the fence of the lease it
-- replaces, however requests interleave. With no row, the insert races other inserts of the
-- same resource; the loser sees the winner's row on its next look and decides again.
--
-- Returns no row when a live lease of another owner holds the resource; otherwise one row,
-- whose `how` names the event: 'fresh', 'reacquired' or 'taken_over'.
CREATE FUNCTION fencelock_acquire(
    p_resource text, p_owner text, p_ttl_seconds integer, p_deadline timestamptz
) RETURNS TABLE (
    fence bigint, acquired_at timestamptz, expires_at timestamptz, observed_at timestamptz,
    how text
)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    -- Stored times are truncated to milliseconds, the precision the API shows, so what a
    -- client reads is exactly what expiry is decided on.
    stamp constant timestamptz := date_trunc('milliseconds', now());
    ends constant timestamptz := stamp + p_ttl_seconds * interval '1 second';
    held_by text;
    held_until timestamptz;
    granted bigint;
BEGIN
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
                expires_at = ends
            WHERE l.resource = p_resource
            RETURNING l.fence INTO granted;
            RETURN QUERY SELECT granted, stamp, ends, now(),
                CASE WHEN held_until > now() THEN 'reacquired' ELSE 'taken_over' END;
            RETURN;
        END IF;
        PERFORM fencelock_in_time(p_deadline);
        INSERT INTO leases AS l (resource, owner, fence, acquired_at, expires_at)
        VALUES (p_resource, p_owner, nextval('lease_fence'), stamp, ends)
        ON CONFLICT (resource) DO NOTHING
        RETURNING l.fence INTO granted;
        IF FOUND THEN
            RETURN QUERY SELECT granted, stamp, ends, now(), 'fresh'::text;
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- One row that readiness rewrites: a hot standby, a read-only database or a full disk fail
-- this write the way they would fail a lease change.
CREATE TABLE store_probe (
    id         integer     NOT NULL,
    checked_at timestamptz NOT NULL,
    CONSTRAINT store_probe_pkey PRIMARY KEY (id),
    CONSTRAINT store_probe_one_row CHECK (id = 1)
);
