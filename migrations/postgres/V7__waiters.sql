-- fencelock: waiting acquisitions (`wait_ms`) and the wake-up path.
--
-- A request that waits for a held resource takes a ticket in `lease_waiters`. Tickets come
-- from one sequence, so every instance sharing this database sees one arrival order. While
-- a live ticket is queued for a resource, the resource goes only to the waiter at the head:
-- every acquire path asks `fencelock_waiters_ahead` before it grants (a re-acquisition by the
-- live holder is not a grant to someone else and is never held back).
--
-- A ticket lives until its wait ends (`expires_at`, the request's wait deadline on this
-- clock). Its waiter deletes it when it gets the lease (in the granting transaction), when
-- its wait ends, or when its client goes away. A ticket of an instance that crashed is
-- skipped from its `expires_at` on: it holds a queue up for at most its `wait_ms` (at most
-- `--max-wait-ms`). The purge deletes such leftovers.
CREATE SEQUENCE lease_waiter_ticket;

CREATE TABLE lease_waiters (
    ticket     bigint PRIMARY KEY DEFAULT nextval('lease_waiter_ticket'),
    resource   text COLLATE "C" NOT NULL,
    expires_at timestamptz NOT NULL
);

-- The queue of one resource, in arrival order.
CREATE INDEX lease_waiters_resource_ticket_idx ON lease_waiters (resource, ticket);

-- NULL when no live ticket of `p_resource` is ahead of `p_ticket` (for a request without a
-- ticket, `p_ticket` NULL: when no live ticket is queued at all); otherwise the first moment
-- the queue may change without anyone saying so: the earliest `expires_at` of the tickets
-- ahead. A grant is allowed only while this is NULL.
CREATE FUNCTION fencelock_waiters_ahead(p_resource text, p_ticket bigint)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(w.expires_at) FROM lease_waiters w
    WHERE w.resource = p_resource AND w.expires_at > now()
      AND (p_ticket IS NULL OR w.ticket < p_ticket)
$$;

-- The waiter holding `p_ticket` got the lease: its ticket leaves the queue in the same
-- transaction. NULL (no ticket) does nothing.
CREATE FUNCTION fencelock_waiter_served(p_ticket bigint) RETURNS void
LANGUAGE sql VOLATILE AS $$
    DELETE FROM lease_waiters w WHERE w.ticket = p_ticket
$$;

-- Wake-ups. Every change that can end a wait or a watch is announced on the channel
-- `fencelock_changes` with the resource name as payload, in the transaction that makes it
-- (so it is delivered only if and when that commits): a lease inserted, deleted (release,
-- purge), or given a new fence (a grant over an expired lease, a re-acquisition), and a
-- ticket leaving a queue. Renewals (only `expires_at` changes) are not announced: nobody's
-- wait ends by them. Triggers, so that every write path (the group commit, the single
-- statements, an older build's statements during a rolling upgrade) announces alike.
-- PostgreSQL folds equal notifications of one transaction into one.
CREATE FUNCTION fencelock_announce_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fencelock_changes',
        CASE TG_OP WHEN 'DELETE' THEN OLD.resource ELSE NEW.resource END);
    RETURN NULL;
END
$$;

CREATE TRIGGER leases_announce_change
AFTER INSERT OR DELETE OR UPDATE OF fence ON leases
FOR EACH ROW EXECUTE FUNCTION fencelock_announce_change();

CREATE TRIGGER lease_waiters_announce_change
AFTER DELETE ON lease_waiters
FOR EACH ROW EXECUTE FUNCTION fencelock_announce_change();

-- Acquire, as in V6, with the queue: `p_ticket` is the caller's ticket (NULL: it does not
-- wait). Changed from V6 (marked `-- V7`): a grant to someone other than the live holder
-- first asks `fencelock_waiters_ahead`; a granted ticket is served; and a refusal returns one
-- row, `how` 'held', whose `expires_at` is when the caller might get the resource (the end of
-- the lease's lock delay, or when the queue ahead may change), for waiters to arm a timer on.
-- The older forms keep their answers (no row when held).
CREATE FUNCTION fencelock_acquire(
    p_resource text, p_owner text, p_ttl_seconds integer, p_deadline timestamptz,
    p_token text, p_max_leases integer, p_lock_delay_ms integer, p_ticket bigint -- V7
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
    held_fence bigint; -- V6
    held_delay integer; -- V6
    queued timestamptz; -- V7
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
        SELECT l.owner, l.expires_at, l.fence, l.lock_delay_ms -- V6: fence, lock_delay_ms
        INTO held_by, held_until, held_fence, held_delay
        FROM leases l WHERE l.resource = p_resource FOR UPDATE;
        IF FOUND THEN
            -- V6: another owner waits out the lock delay too, not only the lease.
            IF held_by <> p_owner AND fencelock_free_at(held_until, held_delay) > now() THEN
                RETURN QUERY SELECT NULL::bigint, NULL::timestamptz, -- V7
                    fencelock_free_at(held_until, held_delay), now(), 'held'::text; -- V7
                RETURN;
            END IF;
            -- V7: the queue comes first, unless this is the live holder re-acquiring.
            queued := CASE WHEN held_until > now() THEN NULL -- V7
                           ELSE fencelock_waiters_ahead(p_resource, p_ticket) END; -- V7
            IF queued IS NOT NULL THEN -- V7
                RETURN QUERY SELECT NULL::bigint, NULL::timestamptz, queued, now(), 'held'::text; -- V7
                RETURN; -- V7
            END IF; -- V7
            PERFORM fencelock_in_time(p_deadline);
            UPDATE leases l
            SET owner = p_owner, fence = nextval('lease_fence'), acquired_at = stamp,
                expires_at = ends, token = p_token,
                lock_delay_ms = p_lock_delay_ms -- V6
            WHERE l.resource = p_resource
            RETURNING l.fence INTO granted;
            PERFORM fencelock_history_granted(p_resource, granted, stamp, ends, -- V6
                held_fence, held_until > now(), held_by = p_owner);
            PERFORM fencelock_waiter_served(p_ticket); -- V7
            RETURN QUERY SELECT granted, stamp, ends, now(),
                CASE WHEN held_until > now() THEN 'reacquired' ELSE 'taken_over' END;
            RETURN;
        END IF;
        queued := fencelock_waiters_ahead(p_resource, p_ticket); -- V7
        IF queued IS NOT NULL THEN -- V7
            RETURN QUERY SELECT NULL::bigint, NULL::timestamptz, queued, now(), 'held'::text; -- V7
            RETURN; -- V7
        END IF; -- V7
        PERFORM fencelock_in_time(p_deadline);
        INSERT INTO leases AS l (resource, owner, fence, acquired_at, expires_at, token,
                                 lock_delay_ms) -- V6
        VALUES (p_resource, p_owner, nextval('lease_fence'), stamp, ends, p_token,
                p_lock_delay_ms) -- V6
        ON CONFLICT (resource) DO NOTHING
        RETURNING l.fence INTO granted;
        IF FOUND THEN
            PERFORM fencelock_history_granted(p_resource, granted, stamp, ends, -- V6
                NULL, false, false);
            PERFORM fencelock_waiter_served(p_ticket); -- V7
            RETURN QUERY SELECT granted, stamp, ends, now(), 'fresh'::text;
            RETURN;
        END IF;
    END LOOP;
END
$$;


-- V6's seven-argument form, for instances of the previous build during a rolling upgrade:
-- the same decision, queue included, without a ticket and with no row when held. (V3's
-- six-argument form calls this one.)
CREATE OR REPLACE FUNCTION fencelock_acquire(
    p_resource text, p_owner text, p_ttl_seconds integer, p_deadline timestamptz,
    p_token text, p_max_leases integer, p_lock_delay_ms integer
) RETURNS TABLE (
    fence bigint, acquired_at timestamptz, expires_at timestamptz, observed_at timestamptz,
    how text
)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM fencelock_acquire(p_resource, p_owner, p_ttl_seconds, p_deadline,
                                    p_token, p_max_leases, p_lock_delay_ms, NULL::bigint) a
    WHERE a.how <> 'held'
$$;

-- The group commit of V6, with the queue (changed lines marked `-- V7`): an acquisition
-- (never with a ticket: waiting acquisitions are decided alone, by `fencelock_acquire`) is
-- held while any live ticket is queued for the resource, unless it is the live holder's
-- re-acquisition; a refusal's `expires_at` is when the caller might get the resource. V5's
-- eight-argument form calls this one.
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
    held_delay integer; -- V6
    queued timestamptz; -- V7
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
            SELECT l.owner, l.fence, l.acquired_at, l.expires_at,
                   l.lock_delay_ms -- V6
            INTO held_by, held_fence, held_since, held_until, held_delay
            FROM leases l WHERE l.resource = v_resource FOR UPDATE;
            present := FOUND;
            live := present AND held_until > now();
            CASE p_kinds[i]
            WHEN 'acquire' THEN
                -- V6: another owner waits out the lock delay too, not only the lease.
                IF present AND held_by <> v_owner
                   AND fencelock_free_at(held_until, held_delay) > now() THEN
                    outcome := 'held';
                    expires_at := fencelock_free_at(held_until, held_delay); -- V7
                    EXIT;
                END IF;
                -- V7: the queue comes first, unless this is the live holder re-acquiring.
                queued := CASE WHEN live THEN NULL -- V7
                               ELSE fencelock_waiters_ahead(v_resource, NULL) END; -- V7
                IF queued IS NOT NULL THEN -- V7
                    outcome := 'held'; -- V7
                    expires_at := queued; -- V7
                ELSIF clock_timestamp() >= p_deadlines[i] THEN
                    outcome := 'too_late';
                ELSIF present THEN
                    UPDATE leases l
                    SET owner = v_owner, fence = nextval('lease_fence'), acquired_at = stamp,
                        expires_at = ends, token = p_tokens[i],
                        lock_delay_ms = coalesce(p_lock_delays[i], 0) -- V6
                    WHERE l.resource = v_resource
                    RETURNING l.fence INTO granted;
                    PERFORM fencelock_history_granted(v_resource, granted, stamp, ends, -- V6
                        held_fence, live, held_by = v_owner);
                    outcome := CASE WHEN live THEN 'reacquired' ELSE 'taken_over' END;
                    fence := granted;
                    acquired_at := stamp;
                    expires_at := ends;
                ELSE
                    INSERT INTO leases AS l (resource, owner, fence, acquired_at, expires_at, token,
                                             lock_delay_ms) -- V6
                    VALUES (v_resource, v_owner, nextval('lease_fence'), stamp, ends, p_tokens[i],
                            coalesce(p_lock_delays[i], 0)) -- V6
                    ON CONFLICT (resource) DO NOTHING
                    RETURNING l.fence INTO granted;
                    CONTINUE WHEN NOT FOUND;
                    PERFORM fencelock_history_granted(v_resource, granted, stamp, ends, -- V6
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
                    PERFORM fencelock_history_renewed(held_fence, ends); -- V6
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
                    PERFORM fencelock_history_released(held_fence, stamp); -- V6
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

