-- fencelock: a release hands the lease to the first waiter in the same transaction.
--
-- Until V9 a waiting acquisition got a released lease in a transaction of its own: the
-- release committed, its announcement woke the waiter's instance, and the waiter's
-- acquisition committed. Two disk syncs in sequence for every hand-over, both of notifying
-- transactions, which PostgreSQL commits one at a time (see V9): under contention, waiting
-- clients won fewer leases per second than the same clients polling, whose acquisition can
-- share the release's batch.
--
-- Now a waiter leaves its acquisition with its ticket (owner, TTL, token, lock delay), and a
-- release grants the lease to the first live ticket of the resource in the release's own
-- transaction: new fence, history, and the grant written into the ticket. The announcement
-- wakes the waiter, whose next attempt takes the grant from its ticket (deleting it, with an
-- asynchronous commit: nothing but that ticket is written). A waiter that gives up (its wait
-- ended, its client went away) deletes its ticket and learns of a grant it was given
-- meanwhile, to answer with it or release it.
--
-- A ticket without an acquisition (an acquisition with a token quota, which must count the
-- token's leases under its advisory lock, or a ticket of an older build) is not served by a
-- release: its waiter is woken and tries itself, as before. A granted ticket is no longer
-- in the queue, and its deletion announces nothing: no one's place changes.

ALTER TABLE lease_waiters
    ADD COLUMN owner text,
    ADD COLUMN ttl_seconds integer,
    ADD COLUMN token text,
    ADD COLUMN lock_delay_ms integer,
    ADD COLUMN granted_fence bigint,
    ADD COLUMN granted_at timestamptz,
    ADD COLUMN granted_until timestamptz;

CREATE OR REPLACE FUNCTION fencelock_waiters_ahead(p_resource text, p_ticket bigint)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(w.expires_at) FROM lease_waiters w
    WHERE w.resource = p_resource AND w.expires_at > now() AND w.granted_fence IS NULL
      AND (p_ticket IS NULL OR w.ticket < p_ticket)
$$;

CREATE OR REPLACE FUNCTION fencelock_waiters_ahead(p_resource text, p_ticket bigint, p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(w.expires_at) FROM lease_waiters w
    WHERE w.resource = p_resource AND w.expires_at > p_at AND w.granted_fence IS NULL
      AND (p_ticket IS NULL OR w.ticket < p_ticket)
$$;

DROP TRIGGER lease_waiters_announce_change ON lease_waiters;

CREATE TRIGGER lease_waiters_announce_change
AFTER DELETE ON lease_waiters
FOR EACH ROW WHEN (OLD.granted_fence IS NULL)
EXECUTE FUNCTION fencelock_announce_change();

-- As in V8, with the lines marked `-- V10` added: a granted ticket is claimed first.
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
    stamp timestamptz;
    ends timestamptz;
    held_by text;
    held_until timestamptz;
    granted bigint;
    others bigint;
    held_fence bigint;
    held_delay integer;
    queued timestamptz;
    present boolean;
    inserted_at timestamptz;
BEGIN
    -- V10: a waiter whose ticket a release has granted takes its lease. Only the served
    -- ticket is deleted here, so the commit need not wait for the disk: were it lost, the
    -- ticket would stay granted (out of the queue) until the purge.
    IF p_ticket IS NOT NULL THEN -- V10
        DELETE FROM lease_waiters w -- V10
        WHERE w.ticket = p_ticket AND w.granted_fence IS NOT NULL -- V10
        RETURNING w.granted_fence, w.granted_at, w.granted_until -- V10
        INTO granted, stamp, ends; -- V10
        IF FOUND THEN -- V10
            PERFORM set_config('synchronous_commit', 'off', true); -- V10
            RETURN QUERY SELECT granted, stamp, ends, -- V10
                greatest(stamp, date_trunc('milliseconds', clock_timestamp())), 'fresh'::text; -- V10
            RETURN; -- V10
        END IF; -- V10
        -- V10: a lease another owner holds, seen without a row lock, is an answer that writes
        -- nothing, so its commit needs no disk sync: the next waiters try after each
        -- hand-over, and find it held. A release this read misses commits after it and wakes
        -- the waiter (its ticket is in): it only looks again.
        SELECT l.owner, l.expires_at, l.lock_delay_ms -- V10
        INTO held_by, held_until, held_delay -- V10
        FROM leases l WHERE l.resource = p_resource; -- V10
        stamp := date_trunc('milliseconds', clock_timestamp()); -- V10
        IF FOUND AND held_by <> p_owner AND fencelock_free_at(held_until, held_delay) > stamp THEN -- V10
            RETURN QUERY SELECT NULL::bigint, NULL::timestamptz, -- V10
                fencelock_free_at(held_until, held_delay), stamp, 'held'::text; -- V10
            RETURN; -- V10
        END IF; -- V10
    END IF; -- V10
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
        present := FOUND;
        stamp := date_trunc('milliseconds', clock_timestamp());
        ends := stamp + p_ttl_seconds * interval '1 second';
        IF present THEN
            IF held_by <> p_owner AND fencelock_free_at(held_until, held_delay) > stamp THEN
                RETURN QUERY SELECT NULL::bigint, NULL::timestamptz,
                    fencelock_free_at(held_until, held_delay), stamp, 'held'::text;
                RETURN;
            END IF;
            queued := CASE WHEN held_until > stamp THEN NULL
                           ELSE fencelock_waiters_ahead(p_resource, p_ticket, stamp) END;
            IF queued IS NOT NULL THEN
                RETURN QUERY SELECT NULL::bigint, NULL::timestamptz, queued, stamp, 'held'::text;
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
                held_fence, held_until > stamp, held_by = p_owner);
            PERFORM fencelock_waiter_served(p_ticket);
            RETURN QUERY SELECT granted, stamp, ends, stamp,
                CASE WHEN held_until > stamp THEN 'reacquired' ELSE 'taken_over' END;
            RETURN;
        END IF;
        queued := fencelock_waiters_ahead(p_resource, p_ticket, stamp);
        IF queued IS NOT NULL THEN
            RETURN QUERY SELECT NULL::bigint, NULL::timestamptz, queued, stamp, 'held'::text;
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
           
            -- lease may have been released meanwhile: the stamp is the clock after it.
            inserted_at := date_trunc('milliseconds', clock_timestamp());
            IF inserted_at > stamp THEN
                stamp := inserted_at;
                ends := stamp + p_ttl_seconds * interval '1 second';
                UPDATE leases l SET acquired_at = stamp, expires_at = ends
                WHERE l.resource = p_resource;
            END IF;
            PERFORM fencelock_history_granted(p_resource, granted, stamp, ends,
                NULL, false, false);
            PERFORM fencelock_waiter_served(p_ticket);
            RETURN QUERY SELECT granted, stamp, ends, stamp, 'fresh'::text;
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- As in V8, with the lines marked `-- V10` added: a release serves the first waiter.
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
    stamp timestamptz;
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
    inserted_at timestamptz;
    head_ticket bigint; -- V10
    head_owner text; -- V10
    head_ttl integer; -- V10
    head_token text; -- V10
    head_delay integer; -- V10
    head_ends timestamptz; -- V10
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
        head_owner := NULL; -- V10
        -- Repeated only when an acquisition's insert lost a race with another insert of the
        -- same resource: the next look sees the winner's row and decides again.
        LOOP
            SELECT l.owner, l.fence, l.acquired_at, l.expires_at,
                   l.lock_delay_ms
            INTO held_by, held_fence, held_since, held_until, held_delay
            FROM leases l WHERE l.resource = v_resource FOR UPDATE;
            present := FOUND;
            stamp := date_trunc('milliseconds', clock_timestamp());
            ends := stamp + p_ttl_seconds[i] * interval '1 second';
            observed_at := stamp;
            live := present AND held_until > stamp;
            CASE p_kinds[i]
            WHEN 'acquire' THEN
                IF present AND held_by <> v_owner
                   AND fencelock_free_at(held_until, held_delay) > stamp THEN
                    outcome := 'held';
                    expires_at := fencelock_free_at(held_until, held_delay);
                    EXIT;
                END IF;
                queued := CASE WHEN live THEN NULL
                               ELSE fencelock_waiters_ahead(v_resource, NULL, stamp) END;
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
                   
                    -- whose lease may have been released meanwhile: the stamp is the clock
                    -- after it.
                    inserted_at := date_trunc('milliseconds', clock_timestamp());
                    IF inserted_at > stamp THEN
                        stamp := inserted_at;
                        ends := stamp + p_ttl_seconds[i] * interval '1 second';
                        observed_at := stamp;
                        UPDATE leases l SET acquired_at = stamp, expires_at = ends
                        WHERE l.resource = v_resource;
                    END IF;
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
                    PERFORM fencelock_history_released(held_fence, stamp);
                    -- V10: the first waiter in the queue gets the lease in this very
                    -- transaction, if it left its acquisition with its ticket.
                    SELECT w.ticket, w.owner, w.ttl_seconds, w.token, w.lock_delay_ms -- V10
                    INTO head_ticket, head_owner, head_ttl, head_token, head_delay -- V10
                    FROM lease_waiters w -- V10
                    WHERE w.resource = v_resource AND w.granted_fence IS NULL -- V10
                      AND w.expires_at > stamp -- V10
                    ORDER BY w.ticket -- V10
                    LIMIT 1 -- V10
                    FOR UPDATE; -- V10
                    IF head_owner IS NULL THEN -- V10
                        DELETE FROM leases l WHERE l.resource = v_resource;
                    ELSE -- V10
                        head_ends := stamp + head_ttl * interval '1 second'; -- V10
                        UPDATE leases l -- V10
                        SET owner = head_owner, fence = nextval('lease_fence'), -- V10
                            acquired_at = stamp, expires_at = head_ends, token = head_token, -- V10
                            lock_delay_ms = head_delay -- V10
                        WHERE l.resource = v_resource -- V10
                        RETURNING l.fence INTO granted; -- V10
                        PERFORM fencelock_history_granted(v_resource, granted, stamp, head_ends, -- V10
                            NULL, false, false); -- V10
                        UPDATE lease_waiters w -- V10
                        SET granted_fence = granted, granted_at = stamp, -- V10
                            granted_until = head_ends -- V10
                        WHERE w.ticket = head_ticket; -- V10
                    END IF; -- V10
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