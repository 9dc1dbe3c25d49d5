-- fencelock: group commit. Concurrent acquire, renew and release requests are decided by one
-- call of `fencelock_apply`, a single statement and so a single transaction: one round trip
-- and one commit (one WAL flush) for all of them.

-- Applies a batch of lease operations; element `i` of every array belongs to the same
-- request. Each element is decided by exactly the rules of its single-statement form
-- (`fencelock_acquire` of V2/V3 without a quota, and the store's renew and release
-- statements), against the state left by the elements decided before it.
--
-- Order. The caller gives the elements in ascending byte order of their resource (requests
-- for one resource in the order they were queued), and they are decided in that order; an
-- element out of order is an error. Every lease row this function locks, and every
-- insertion it waits for, is therefore taken in one global order, and two batches running
-- at once can never wait on each other in a cycle.
-- The single-statement forms lock at most one lease row (an acquisition with a quota takes
-- its token's advisory lock first, which no batch takes), and the purge skips locked rows,
-- so nothing else can close a cycle either.
--
-- Nothing here raises for one element: a refusal is an outcome, and so is a deadline that
-- has passed when the element is about to be written ('too_late', checked after the row lock
-- as `fencelock_in_time` is), so one late request does not undo the others. An error (a
-- statement timeout, a lock wait past `p_lock_wait_ms`) rolls the whole batch back; the
-- caller then decides each request on its own.
--
-- `p_lock_wait_ms` bounds each wait for a row lock (0: no bound), for the rest of the
-- transaction: a lease row held by a transaction from outside would otherwise hold up every
-- request of the batch. Call it as a statement of its own, outside an explicit transaction.
--
-- Returns one row per element: `ord`, its index in the arrays (1-based), and `outcome`:
--   acquire: 'fresh', 'reacquired', 'taken_over' (with the new lease), 'held', 'too_late'
--   renew:   'renewed' (with the lease), 'not_found', 'expired', 'owner_mismatch',
--            'stale_fence' (with the lease's fence), 'too_late'
--   release: 'released' (with the released lease's fence and acquisition time; released at
--            `observed_at`), 'not_found', 'not_owner', 'stale_fence' (with the lease's
--            fence), 'too_late'
-- `observed_at` is the database's `now()` for every row.
--
-- Fences come from `lease_fence` only for grants, right after the row lock (or with the
-- insert), as in `fencelock_acquire`: a fence issued for a resource is always greater than
-- the fence of the lease it replaces.
CREATE FUNCTION fencelock_apply(
    p_kinds text[], p_resources text[], p_owners text[], p_ttl_seconds integer[],
    p_fences bigint[], p_tokens text[], p_deadlines timestamptz[], p_lock_wait_ms integer
) RETURNS TABLE (
    ord integer, outcome text, fence bigint, acquired_at timestamptz, expires_at timestamptz,
    observed_at timestamptz
)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    stamp constant timestamptz := date_trunc('milliseconds', now());
    i integer;
    v_resource text;
    v_owner text;
    v_fence bigint;
    ends timestamptz;
    present boolean;
    live boolean;
    held_by text;
    held_fence bigint;
    held_since timestamptz;
    held_until timestamptz;
    granted bigint;
BEGIN
    PERFORM set_config('lock_timeout', p_lock_wait_ms::text, true);
    FOR i IN 1 .. cardinality(p_resources) LOOP
        v_resource := p_resources[i];
        IF i > 1 AND v_resource COLLATE "C" < p_resources[i - 1] THEN
            RAISE EXCEPTION 'fencelock_apply: resource % comes after %, out of order',
                v_resource, p_resources[i - 1];
        END IF;
        v_owner := p_owners[i];
        v_fence := p_fences[i];
        ends := stamp + p_ttl_seconds[i] * interval '1 second';
        ord := i;
        fence := NULL;
        acquired_at := NULL;
        expires_at := NULL;
        observed_at := now();
        -- Repeated only when an acquisition's insert lost a race with another insert of the
        -- same resource: the next look sees the winner's row and decides again.
        LOOP
            SELECT l.owner, l.fence, l.acquired_at, l.expires_at
            INTO held_by, held_fence, held_since, held_until
            FROM leases l WHERE l.resource = v_resource FOR UPDATE;
            present := FOUND;
            live := present AND held_until > now();
            CASE p_kinds[i]
            WHEN 'acquire' THEN
                IF live AND held_by <> v_owner THEN
                    outcome := 'held';
                ELSIF clock_timestamp() >= p_deadlines[i] THEN
                    outcome := 'too_late';
                ELSIF present THEN
                    UPDATE leases l
                    SET owner = v_owner, fence = nextval('lease_fence'), acquired_at = stamp,
                        expires_at = ends, token = p_tokens[i]
                    WHERE l.resource = v_resource
                    RETURNING l.fence INTO granted;
                    outcome := CASE WHEN live THEN 'reacquired' ELSE 'taken_over' END;
                    fence := granted;
                    acquired_at := stamp;
                    expires_at := ends;
                ELSE
                    INSERT INTO leases AS l (resource, owner, fence, acquired_at, expires_at, token)
                    VALUES (v_resource, v_owner, nextval('lease_fence'), stamp, ends, p_tokens[i])
                    ON CONFLICT (resource) DO NOTHING
                    RETURNING l.fence INTO granted;
                    CONTINUE WHEN NOT FOUND;
                    outcome := 'fresh';
                    fence := granted;
                    acquired_at := stamp;
                    expires_at := ends;
                END IF;
            WHEN 'renew' THEN
                IF NOT present THEN
                    outcome := 'not_found';
                ELSIF NOT live THEN
                    outcome := 'expired';
                ELSIF held_by <> v_owner THEN
                    outcome := 'owner_mismatch';
                ELSIF v_fence IS NOT NULL AND v_fence <> held_fence THEN
                    outcome := 'stale_fence';
                    fence := held_fence;
                ELSIF clock_timestamp() >= p_deadlines[i] THEN
                    outcome := 'too_late';
                ELSE
                    UPDATE leases l SET expires_at = ends WHERE l.resource = v_resource;
                    outcome := 'renewed';
                    fence := held_fence;
                    acquired_at := held_since;
                    expires_at := ends;
                END IF;
            WHEN 'release' THEN
                IF NOT live THEN
                    outcome := 'not_found';
                ELSIF held_by <> v_owner THEN
                    outcome := 'not_owner';
                ELSIF v_fence IS NOT NULL AND v_fence <> held_fence THEN
                    outcome := 'stale_fence';
                    fence := held_fence;
                ELSIF clock_timestamp() >= p_deadlines[i] THEN
                    outcome := 'too_late';
                ELSE
                    DELETE FROM leases l WHERE l.resource = v_resource;
                    outcome := 'released';
                    fence := held_fence;
                    acquired_at := held_since;
                END IF;
            ELSE
                RAISE EXCEPTION 'fencelock_apply: unknown operation %', p_kinds[i];
            END CASE;
            EXIT;
        END LOOP;
        RETURN NEXT;
    END LOOP;
END
$$;

