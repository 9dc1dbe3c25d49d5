-- fencelock: a refused acquisition locks nothing, and the lock delay's end is computed inline.
--
-- `fencelock_apply` read every lease with `FOR UPDATE`, also to answer "held". A row lock is a
-- write: it is logged, it makes the batch's commit wait for the disk, and it holds up the
-- holder's own release (or renewal) of that lease until the batch that merely looked has
-- committed. Under contention most acquisitions are refused, so most of the lock traffic on a
-- hot lease was for nothing. Now an acquisition first reads the lease without a lock; a lease
-- another owner holds (lock delay included) is the answer. That answer is as of the read: a
-- release that has not committed yet has not happened. An expired lease or the caller's own
-- is decided under the row lock as before; where there was no lease at all there is no row to
-- lock, so that read stands and the insert follows (a concurrent insert makes it look again).
--
-- `fencelock_free_at` was declared IMMUTABLE, but adding an interval to a timestamptz is only
-- STABLE, so PostgreSQL would not inline it: every call went through the SQL function
-- executor, which parses and plans the body again (with track_functions on, 0.02 to 0.04 ms a
-- call under load, two calls per refused acquisition). Declared STABLE, which it is, it is
-- inlined into the expressions that call it.

CREATE OR REPLACE FUNCTION fencelock_free_at(p_expires_at timestamptz, p_lock_delay_ms integer)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT p_expires_at + coalesce(p_lock_delay_ms, 0) * interval '1 millisecond'
$$;

-- As in V10, with the lines marked `-- V13` added: an acquisition of a lease another owner
-- holds is answered from a plain read.
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
    looked_absent boolean; -- V13
    head_ticket bigint;
    head_owner text;
    head_ttl integer;
    head_token text;
    head_delay integer;
    head_ends timestamptz;
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
        head_owner := NULL;
        looked_absent := false; -- V13
        IF p_kinds[i] = 'acquire' THEN -- V13
            SELECT l.owner, l.expires_at, l.lock_delay_ms -- V13
            INTO held_by, held_until, held_delay -- V13
            FROM leases l WHERE l.resource = v_resource; -- V13
            looked_absent := NOT FOUND; -- V13
            stamp := date_trunc('milliseconds', clock_timestamp()); -- V13
            IF NOT looked_absent AND held_by <> v_owner -- V13
               AND fencelock_free_at(held_until, held_delay) > stamp THEN -- V13
                outcome := 'held'; -- V13
                expires_at := fencelock_free_at(held_until, held_delay); -- V13
                observed_at := stamp; -- V13
                RETURN NEXT; -- V13
                CONTINUE; -- V13
            END IF; -- V13
        END IF; -- V13
        -- Repeated only when an acquisition's insert lost a race with another insert of the
        -- same resource: the next look sees the winner's row and decides again.
        LOOP
            IF looked_absent THEN -- V13
                -- No lease a moment ago: no row to lock, and no need to look again. An
                -- insert that lost a race with another loops back here and does look.
                looked_absent := false; -- V13
                present := false; -- V13
                held_fence := NULL; -- V13
                held_since := NULL; -- V13
            ELSE -- V13
                SELECT l.owner, l.fence, l.acquired_at, l.expires_at,
                       l.lock_delay_ms
                INTO held_by, held_fence, held_since, held_until, held_delay
                FROM leases l WHERE l.resource = v_resource FOR UPDATE;
                present := FOUND;
            END IF; -- V13
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
                    SELECT w.ticket, w.owner, w.ttl_seconds, w.token, w.lock_delay_ms
                    INTO head_ticket, head_owner, head_ttl, head_token, head_delay
                    FROM lease_waiters w
                    WHERE w.resource = v_resource AND w.granted_fence IS NULL
                      AND w.expires_at > stamp
                    ORDER BY w.ticket
                    LIMIT 1
                    FOR UPDATE;
                    IF head_owner IS NULL THEN
                        DELETE FROM leases l WHERE l.resource = v_resource;
                    ELSE
                        head_ends := stamp + head_ttl * interval '1 second';
                        UPDATE leases l
                        SET owner = head_owner, fence = nextval('lease_fence'),
                            acquired_at = stamp, expires_at = head_ends, token = head_token,
                            lock_delay_ms = head_delay
                        WHERE l.resource = v_resource
                        RETURNING l.fence INTO granted;
                        PERFORM fencelock_history_granted(v_resource, granted, stamp, head_ends,
                            NULL, false, false);
                        UPDATE lease_waiters w
                        SET granted_fence = granted, granted_at = stamp,
                            granted_until = head_ends
                        WHERE w.ticket = head_ticket;
                    END IF;
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