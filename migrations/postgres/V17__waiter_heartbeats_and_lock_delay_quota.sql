-- fencelock: a waiter's ticket lives by a heartbeat, a grant nobody takes is undone, a lease
-- counts against its token's quota until its lock delay has passed, and history is trimmed
-- per resource.
--
-- Until V16 a ticket lived until its wait deadline (`expires_at`). A ticket of an instance
-- that died (kill -9, a lost machine) still looked live for the rest of its wait: a release
-- handed it the lease in the release's transaction (V10), for the waiter's whole TTL, and
-- nobody could take the resource until that expired. A grant made while the waiter's
-- instance could not reach the database (a partition) was lost the same way.
--
-- Now the wait deadline has a column of its own (`wait_until`), and `expires_at`, the column
-- every check of a live ticket reads, is a heartbeat: at most 2 s ahead, never past
-- `wait_until`. Each server instance extends all of its own waiters' tickets in one statement
-- every 500 ms, while it has waiters. A ticket whose instance died stops counting within 2 s.
-- A ticket without `wait_until` is one of an older build (or one a test writes directly): it
-- lives until its `expires_at` and is granted as in V10.
--
-- A release grants a ticket with a heartbeat a provisional lease: it expires at most 2 s
-- later and has no lock delay. The waiter takes it (`fencelock_claim_grant`, from its next
-- attempt or its dequeue), which gives the lease the waiter's own expiry and lock delay, with
-- a synchronous commit: from then on the lease is the client's, and a commit lost in a crash
-- would take it back from a client that was told it holds it. A grant nobody takes expires
-- like any lease: the next live waiter (woken by its timer, which the refusal's "free at"
-- sets to that expiry) or any acquirer gets the resource. A waiter that comes back too late
-- finds its grant undone, and its ticket goes back into the queue at its place.
--
-- A refusal because of a lock delay carries the expired lease's `expires_at` in the refusal
-- row's `acquired_at` (NULL otherwise), so that the answer can say `delayed_until`; the
-- outcome stays 'held', which older builds read as before.
--
-- A token's quota counts the leases it holds and those whose lock delay has not passed.
--
-- A resource's history is trimmed to its newest leases by the purge
-- (`fencelock_trim_history`), never on the request path.

ALTER TABLE lease_waiters ADD COLUMN wait_until timestamptz;

-- The grant of lease `p_fence` of `p_resource`, written into a ticket by a release, becomes
-- the waiter's for good if that lease is still there and live (a provisional grant that ran
-- out is undone, and may have been taken by someone else): it gets the expiry and the lock
-- delay the waiter asked for. Returns whether the grant stands; the caller deletes or resets
-- the ticket. A grant of V10's kind (already the full lease) writes nothing but the ticket,
-- so its commit need not wait for the disk, as in V10.
CREATE FUNCTION fencelock_claim_grant(
    p_resource text, p_fence bigint, p_until timestamptz, p_lock_delay_ms integer
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    held_until timestamptz;
    held_delay integer;
BEGIN
    SELECT l.expires_at, l.lock_delay_ms INTO held_until, held_delay
    FROM leases l WHERE l.resource = p_resource AND l.fence = p_fence
    FOR UPDATE;
    IF NOT FOUND OR held_until <= clock_timestamp() THEN
        RETURN false;
    END IF;
    IF held_until <> p_until OR held_delay <> coalesce(p_lock_delay_ms, 0) THEN
        UPDATE leases l SET expires_at = p_until, lock_delay_ms = coalesce(p_lock_delay_ms, 0)
        WHERE l.resource = p_resource;
        UPDATE lease_history h SET expires_at = p_until WHERE h.fence = p_fence;
    ELSE
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN true;
END
$$;

-- A waiter leaves the queue; the lease a release granted its ticket, if the grant stands, is
-- the waiter's (no row otherwise). The delete announces itself through the queue's trigger.
CREATE FUNCTION fencelock_dequeue(p_ticket bigint)
RETURNS TABLE (fence bigint, acquired_at timestamptz, expires_at timestamptz, observed_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_resource text;
    g_fence bigint;
    g_at timestamptz;
    g_until timestamptz;
    g_delay integer;
BEGIN
    DELETE FROM lease_waiters w WHERE w.ticket = p_ticket
    RETURNING w.resource, w.granted_fence, w.granted_at, w.granted_until, w.lock_delay_ms
    INTO v_resource, g_fence, g_at, g_until, g_delay;
    IF g_fence IS NOT NULL AND fencelock_claim_grant(v_resource, g_fence, g_until, g_delay) THEN
        RETURN QUERY SELECT g_fence, g_at, g_until,
            greatest(g_at, date_trunc('milliseconds', clock_timestamp()));
    END IF;
END
$$;

-- Trims the history of each resource acquired in the last `p_recent_ms` to its newest
-- `p_keep` leases (the purge calls it): the recent rows are found by the acquisition index
-- (V12), each resource's newest by its fence index. Returns how many rows it deleted.
CREATE FUNCTION fencelock_trim_history(p_keep integer, p_recent_ms bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    trimmed bigint;
BEGIN
    DELETE FROM lease_history h USING (
        SELECT r.resource,
               (SELECT x.fence FROM lease_history x WHERE x.resource = r.resource
                ORDER BY x.fence DESC OFFSET p_keep LIMIT 1) AS newest_dropped
        FROM (SELECT DISTINCT y.resource FROM lease_history y
              WHERE y.acquired_at > now() - p_recent_ms * interval '1 millisecond') r
    ) c
    WHERE h.resource = c.resource AND h.fence <= c.newest_dropped;
    GET DIAGNOSTICS trimmed = ROW_COUNT;
    RETURN trimmed;
END
$$;

-- As in V10 (its markers dropped), with the lines marked `-- V17` changed: a grant is taken
-- only while it stands, a refusal says when it is a lock delay's, and the quota counts the
-- leases in their lock delay.
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
    -- V17: a waiter whose ticket a release has granted takes its lease, if the grant still
    -- stands (`fencelock_claim_grant`); one that was undone puts the ticket back in the queue
    -- at its place, and the waiter competes as any other.
    IF p_ticket IS NOT NULL THEN -- V17
        SELECT w.granted_fence, w.granted_at, w.granted_until, w.lock_delay_ms -- V17
        INTO granted, stamp, ends, held_delay -- V17
        FROM lease_waiters w -- V17
        WHERE w.ticket = p_ticket AND w.granted_fence IS NOT NULL -- V17
        FOR UPDATE; -- V17
        IF FOUND THEN -- V17
            IF fencelock_claim_grant(p_resource, granted, ends, held_delay) THEN -- V17
                DELETE FROM lease_waiters w WHERE w.ticket = p_ticket; -- V17
                RETURN QUERY SELECT granted, stamp, ends, -- V17
                    greatest(stamp, date_trunc('milliseconds', clock_timestamp())), 'fresh'::text; -- V17
                RETURN; -- V17
            END IF; -- V17
            UPDATE lease_waiters w -- V17
            SET granted_fence = NULL, granted_at = NULL, granted_until = NULL -- V17
            WHERE w.ticket = p_ticket; -- V17
        END IF; -- V17
        -- A lease another owner holds, seen without a row lock, is an answer that writes
        -- nothing, so its commit needs no disk sync: the next waiters try after each
        -- hand-over, and find it held. A release this read misses commits after it and wakes
        -- the waiter (its ticket is in): it only looks again.
        SELECT l.owner, l.expires_at, l.lock_delay_ms
        INTO held_by, held_until, held_delay
        FROM leases l WHERE l.resource = p_resource;
        stamp := date_trunc('milliseconds', clock_timestamp());
        IF FOUND AND held_by <> p_owner AND fencelock_free_at(held_until, held_delay) > stamp THEN
            RETURN QUERY SELECT NULL::bigint,
                CASE WHEN held_until <= stamp THEN held_until END, -- V17
                fencelock_free_at(held_until, held_delay), stamp, 'held'::text;
            RETURN;
        END IF;
    END IF;
    IF p_token IS NOT NULL AND p_max_leases IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('fencelock.token:' || p_token, 0));
        -- V17: a lease counts until its lock delay has passed. The first bound (the longest
        -- lock delay is 60 s) keeps the count a range scan of the token's expiry index.
        SELECT count(*) INTO others FROM leases l
        WHERE l.token = p_token AND l.expires_at > now() - interval '60 seconds' -- V17
          AND fencelock_free_at(l.expires_at, l.lock_delay_ms) > now() -- V17
          AND l.resource <> p_resource;
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
                RETURN QUERY SELECT NULL::bigint,
                    CASE WHEN held_until <= stamp THEN held_until END, -- V17
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
            -- The insert may have waited for another insert of this resource, whose
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

-- As in V16 (its markers dropped), with the lines marked `-- V17` changed: a refusal says when
-- it is a lock delay's, and a release grants a waiter with a heartbeat a provisional lease.
CREATE OR REPLACE FUNCTION fencelock_apply(
    p_kinds text[], p_resources text[], p_owners text[], p_ttl_seconds integer[],
    p_fences bigint[], p_tokens text[], p_deadlines timestamptz[], p_lock_wait_ms integer,
    p_lock_delays integer[]
) RETURNS TABLE (
    ord integer, outcome text, fence bigint, acquired_at timestamptz, expires_at timestamptz,
    observed_at timestamptz
)
LANGUAGE plpgsql VOLATILE
SET fencelock.announcing = 'inline'
AS $$
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
    looked_absent boolean;
    head_ticket bigint;
    head_owner text;
    head_ttl integer;
    head_token text;
    head_delay integer;
    head_ends timestamptz;
    changed boolean;
    head_beats boolean; -- V17
    head_held timestamptz; -- V17
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
        looked_absent := false;
        IF p_kinds[i] = 'acquire' THEN
            SELECT l.owner, l.expires_at, l.lock_delay_ms
            INTO held_by, held_until, held_delay
            FROM leases l WHERE l.resource = v_resource;
            looked_absent := NOT FOUND;
            stamp := date_trunc('milliseconds', clock_timestamp());
            IF NOT looked_absent AND held_by <> v_owner
               AND fencelock_free_at(held_until, held_delay) > stamp THEN
                outcome := 'held';
                expires_at := fencelock_free_at(held_until, held_delay);
                acquired_at := CASE WHEN held_until <= stamp THEN held_until END; -- V17
                observed_at := stamp;
                RETURN NEXT;
                CONTINUE;
            END IF;
        END IF;
        changed := false;
        -- Repeated only when an acquisition's insert lost a race with another insert of the
        -- same resource: the next look sees the winner's row and decides again.
        LOOP
            IF looked_absent THEN
                -- No lease a moment ago: no row to lock, and no need to look again. An
                -- insert that lost a race with another loops back here and does look.
                looked_absent := false;
                present := false;
                held_fence := NULL;
                held_since := NULL;
            ELSE
                SELECT l.owner, l.fence, l.acquired_at, l.expires_at,
                       l.lock_delay_ms
                INTO held_by, held_fence, held_since, held_until, held_delay
                FROM leases l WHERE l.resource = v_resource FOR UPDATE;
                present := FOUND;
            END IF;
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
                    acquired_at := CASE WHEN held_until <= stamp THEN held_until END; -- V17
                    EXIT;
                END IF;
                IF live THEN
                    queued := NULL;
                ELSE
                    SELECT min(w.expires_at) INTO queued FROM lease_waiters w
                    WHERE w.resource = v_resource AND w.expires_at > stamp
                      AND w.granted_fence IS NULL;
                END IF;
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
                    changed := true;
                    IF live OR held_by <> v_owner THEN
                        UPDATE lease_history h
                        SET end_kind = CASE WHEN live THEN 'released' ELSE 'taken_over' END,
                            ended_at = CASE WHEN live THEN stamp ELSE h.expires_at END
                        WHERE h.fence = held_fence AND h.end_kind IS NULL;
                    END IF;
                    INSERT INTO lease_history (fence, resource, acquired_at, expires_at)
                    VALUES (granted, v_resource, stamp, ends);
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
                    changed := true;
                    -- The insert may have waited for another insert of this resource,
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
                    INSERT INTO lease_history (fence, resource, acquired_at, expires_at)
                    VALUES (granted, v_resource, stamp, ends);
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
                    UPDATE lease_history h
                    SET expires_at = ends, renewals = h.renewals + 1
                    WHERE h.fence = held_fence;
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
                    UPDATE lease_history h
                    SET end_kind = 'released', ended_at = stamp
                    WHERE h.fence = held_fence AND h.end_kind IS NULL;
                    -- V10: the first waiter in the queue gets the lease in this very
                    -- transaction, if it left its acquisition with its ticket.
                    SELECT w.ticket, w.owner, w.ttl_seconds, w.token, w.lock_delay_ms,
                           w.wait_until IS NOT NULL -- V17
                    INTO head_ticket, head_owner, head_ttl, head_token, head_delay,
                         head_beats -- V17
                    FROM lease_waiters w
                    WHERE w.resource = v_resource AND w.granted_fence IS NULL
                      AND w.expires_at > stamp
                    ORDER BY w.ticket
                    LIMIT 1
                    FOR UPDATE;
                    IF head_owner IS NULL THEN
                        DELETE FROM leases l WHERE l.resource = v_resource;
                        changed := true;
                    ELSE
                        head_ends := stamp + head_ttl * interval '1 second';
                        -- V17: a waiter with a heartbeat holds the grant only until it takes
                        -- it (`fencelock_claim_grant`): 2 s at most, and without its lock
                        -- delay, so that a grant nobody takes frees the resource soon.
                        head_held := CASE WHEN head_beats -- V17
                            THEN least(head_ends, stamp + interval '2 seconds') -- V17
                            ELSE head_ends END; -- V17
                        UPDATE leases l
                        SET owner = head_owner, fence = nextval('lease_fence'),
                            acquired_at = stamp, expires_at = head_held, token = head_token, -- V17
                            lock_delay_ms = CASE WHEN head_beats THEN 0 ELSE head_delay END -- V17
                        WHERE l.resource = v_resource
                        RETURNING l.fence INTO granted;
                        changed := true;
                        INSERT INTO lease_history (fence, resource, acquired_at, expires_at)
                        VALUES (granted, v_resource, stamp, head_held); -- V17
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
        IF changed THEN
            IF EXISTS (SELECT FROM lease_waiters w WHERE w.resource = v_resource
                       UNION ALL
                       SELECT FROM lease_watchers w WHERE w.resource = v_resource) THEN
                PERFORM pg_notify('fencelock_changes', v_resource);
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
