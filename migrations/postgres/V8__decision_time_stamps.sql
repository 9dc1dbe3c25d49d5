-- fencelock: every decision is stamped with the store's clock read after its row lock.
--
-- Until V7 a decision was judged and stamped with `now()`, the start of its transaction. A
-- transaction that starts first but waits for a resource's row lock decides after the one
-- it waited for has committed (say, a release deleting the lease), yet stamped its new lease
-- with the earlier time: by the stamps, two leases of one resource were live at once for a
-- few milliseconds. Commit order and timestamps must agree. So each decision now reads
-- `clock_timestamp()` once it holds its resource's row lock (`stamp`, per request of a
-- batch), and uses that one reading for everything it judges and writes: liveness, the lock
-- delay, the queue, `acquired_at`, `expires_at`, the history and `observed_at` (clients take
-- `expires_in_ms` as `expires_at - observed_at`, so it never exceeds the TTL). Stamps are
-- whole milliseconds, so two decisions can carry the same stamp; leases are half-open,
-- [acquired_at, expires_at), so a lease starting when another ends does not overlap it.
--
-- A resource without a row has no row lock to take: there the stamp is read after the
-- insert succeeded (the insert waits for a concurrent insert of the same resource, and that
-- lease may have been released meanwhile), and the row is re-stamped if the clock moved.
--
-- The token quota's count keeps `now()`: it is taken before any row lock, and an earlier
-- clock counts a lease that has expired since as live, which refuses, never over-grants.
-- The purges keep `now()` too: they write no time, and an earlier clock only finds fewer
-- leases past their lock delay and grace, never a live one.
--
-- The bodies below are V7's with only the lines marked `-- V8` added or changed; the
-- signatures are V7's, so older callers and the schema check are unaffected.

-- `fencelock_waiters_ahead` judged at `p_at`, the deciding transaction's stamp (V7's form
-- judges at `now()`, which is earlier and would count tickets that expired meanwhile).
CREATE FUNCTION fencelock_waiters_ahead(p_resource text, p_ticket bigint, p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(w.expires_at) FROM lease_waiters w
    WHERE w.resource = p_resource AND w.expires_at > p_at
      AND (p_ticket IS NULL OR w.ticket < p_ticket)
$$;

CREATE OR REPLACE FUNCTION fencelock_acquire(
    p_resource text, p_owner text, p_ttl_seconds integer, p_deadline timestamptz,
    p_token text, p_max_leases integer, p_lock_delay_ms integer, p_ticket bigint
) RETURNS TABLE (
    fence bigint, acquired_at timestamptz, expires_at timestamptz, observed_at timestamptz,
    how text
)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    stamp timestamptz; -- V8: read after the row lock
    ends timestamptz; -- V8
    held_by text;
    held_until timestamptz;
    granted bigint;
    others bigint;
    held_fence bigint;
    held_delay integer;
    queued timestamptz;
    present boolean; -- V8
    inserted_at timestamptz; -- V8
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
        SELECT l.owner, l.expires_at, l.fence, l.lock_delay_ms
        INTO held_by, held_until, held_fence, held_delay
        FROM leases l WHERE l.resource = p_resource FOR UPDATE;
        present := FOUND; -- V8
        stamp := date_trunc('milliseconds', clock_timestamp()); -- V8
        ends := stamp + p_ttl_seconds * interval '1 second'; -- V8
        IF present THEN -- V8
            IF held_by <> p_owner AND fencelock_free_at(held_until, held_delay) > stamp THEN -- V8
                RETURN QUERY SELECT NULL::bigint, NULL::timestamptz,
                    fencelock_free_at(held_until, held_delay), stamp, 'held'::text; -- V8
                RETURN;
            END IF;
            queued := CASE WHEN held_until > stamp THEN NULL -- V8
                           ELSE fencelock_waiters_ahead(p_resource, p_ticket, stamp) END; -- V8
            IF queued IS NOT NULL THEN
                RETURN QUERY SELECT NULL::bigint, NULL::timestamptz, queued, stamp, 'held'::text; -- V8
                RETURN;
            END IF;
            PERFORM fencelock_in_time(p_deadline);
            UPDATE leases l
            SET owner = p_owner, fence = nextval('lease_fence'), acquired_at = stamp,
                expires_at = ends, token = p_token,
                lock_delay_ms = p_lock_delay_ms
            WHERE l.resource = p_resource
            RETURNING l.fence INTO granted;
            PERFORM fencelock_history_granted(p_resource, granted, stamp, ends,
                held_fence, held_until > stamp, held_by = p_owner); -- V8
            PERFORM fencelock_waiter_served(p_ticket);
            RETURN QUERY SELECT granted, stamp, ends, stamp, -- V8
                CASE WHEN held_until > stamp THEN 'reacquired' ELSE 'taken_over' END; -- V8
            RETURN;
        END IF;
        queued := fencelock_waiters_ahead(p_resource, p_ticket, stamp); -- V8
        IF queued IS NOT NULL THEN
            RETURN QUERY SELECT NULL::bigint, NULL::timestamptz, queued, stamp, 'held'::text; -- V8
            RETURN;
        END IF;
        PERFORM fencelock_in_time(p_deadline);
        INSERT INTO leases AS l (resource, owner, fence, acquired_at, expires_at, token,
                                 lock_delay_ms)
        VALUES (p_resource, p_owner, nextval('lease_fence'), stamp, ends, p_token,
                p_lock_delay_ms)
        ON CONFLICT (resource) DO NOTHING
        RETURNING l.fence INTO granted;
        IF FOUND THEN
            -- V8: the insert may have waited for another insert of this resource, whose
            -- lease may have been released meanwhile: the stamp is the clock after it.
            inserted_at := date_trunc('milliseconds', clock_timestamp()); -- V8
            IF inserted_at > stamp THEN -- V8
                stamp := inserted_at; -- V8
                ends := stamp + p_ttl_seconds * interval '1 second'; -- V8
                UPDATE leases l SET acquired_at = stamp, expires_at = ends -- V8
                WHERE l.resource = p_resource; -- V8
            END IF; -- V8
            PERFORM fencelock_history_granted(p_resource, granted, stamp, ends,
                NULL, false, false);
            PERFORM fencelock_waiter_served(p_ticket);
            RETURN QUERY SELECT granted, stamp, ends, stamp, 'fresh'::text; -- V8
            RETURN;
        END IF;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION fencelock_apply(
    p_kinds text[], p_resources text[], p_owners text[], p_ttl_seconds integer[],
    p_fences bigint[], p_tokens text[], p_deadlines timestamptz[], p_lock_wait_ms integer,
    p_lock_delays integer[]
) RETURNS TABLE (
    ord integer, outcome text, fence bigint, acquired_at timestamptz, expires_at timestamptz,
    observed_at timestamptz
)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    stamp timestamptz; -- V8: read per request, after its row lock
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
    held_delay integer;
    queued timestamptz;
    inserted_at timestamptz; -- V8
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
        ord := i;
        fence := NULL;
        acquired_at := NULL;
        expires_at := NULL;
        -- Repeated only when an acquisition's insert lost a race with another insert of the
        -- same resource: the next look sees the winner's row and decides again.
        LOOP
            SELECT l.owner, l.fence, l.acquired_at, l.expires_at,
                   l.lock_delay_ms
            INTO held_by, held_fence, held_since, held_until, held_delay
            FROM leases l WHERE l.resource = v_resource FOR UPDATE;
            present := FOUND;
            stamp := date_trunc('milliseconds', clock_timestamp()); -- V8
            ends := stamp + p_ttl_seconds[i] * interval '1 second'; -- V8
            observed_at := stamp; -- V8
            live := present AND held_until > stamp; -- V8
            CASE p_kinds[i]
            WHEN 'acquire' THEN
                IF present AND held_by <> v_owner
                   AND fencelock_free_at(held_until, held_delay) > stamp THEN -- V8
                    outcome := 'held';
                    expires_at := fencelock_free_at(held_until, held_delay);
                    EXIT;
                END IF;
                queued := CASE WHEN live THEN NULL
                               ELSE fencelock_waiters_ahead(v_resource, NULL, stamp) END; -- V8
                IF queued IS NOT NULL THEN
                    outcome := 'held';
                    expires_at := queued;
                ELSIF clock_timestamp() >= p_deadlines[i] THEN
                    outcome := 'too_late';
                ELSIF present THEN
                    UPDATE leases l
                    SET owner = v_owner, fence = nextval('lease_fence'), acquired_at = stamp,
                        expires_at = ends, token = p_tokens[i],
                        lock_delay_ms = coalesce(p_lock_delays[i], 0)
                    WHERE l.resource = v_resource
                    RETURNING l.fence INTO granted;
                    PERFORM fencelock_history_granted(v_resource, granted, stamp, ends,
                        held_fence, live, held_by = v_owner);
                    outcome := CASE WHEN live THEN 'reacquired' ELSE 'taken_over' END;
                    fence := granted;
                    acquired_at := stamp;
                    expires_at := ends;
                ELSE
                    INSERT INTO leases AS l (resource, owner, fence, acquired_at, expires_at, token,
                                             lock_delay_ms)
                    VALUES (v_resource, v_owner, nextval('lease_fence'), stamp, ends, p_tokens[i],
                            coalesce(p_lock_delays[i], 0))
                    ON CONFLICT (resource) DO NOTHING
                    RETURNING l.fence INTO granted;
                    CONTINUE WHEN NOT FOUND;
                    -- V8: the insert may have waited for another insert of this resource,
                    -- whose lease may have been released meanwhile: the stamp is the clock
                    -- after it.
                    inserted_at := date_trunc('milliseconds', clock_timestamp()); -- V8
                    IF inserted_at > stamp THEN -- V8
                        stamp := inserted_at; -- V8
                        ends := stamp + p_ttl_seconds[i] * interval '1 second'; -- V8
                        observed_at := stamp; -- V8
                        UPDATE leases l SET acquired_at = stamp, expires_at = ends -- V8
                        WHERE l.resource = v_resource; -- V8
                    END IF; -- V8
                    PERFORM fencelock_history_granted(v_resource, granted, stamp, ends,
                        NULL, false, false);
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
                    PERFORM fencelock_history_renewed(held_fence, ends);
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
                    PERFORM fencelock_history_released(held_fence, stamp);
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
