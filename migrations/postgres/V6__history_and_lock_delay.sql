-- fencelock: the history of every resource's leases (`GET /locks/{resource}/history`), and a
-- lock delay kept with each lease (`lock_delay_ms` on acquire).
--
-- History rows are written by the same statement (and so the same transaction) as the lease
-- change they record, through the `fencelock_history_*` functions below: a crash cannot keep
-- one without the other. Only ends that are final when they happen are written (a release, a
-- live lease replaced by its owner's re-acquisition, an expired lease taken over by another
-- owner); whether a lease without a recorded end is live or expired is read off `expires_at`
-- against `now()` when the history is read, so expiry needs no write.
--
-- The bodies of `fencelock_acquire` and `fencelock_apply` below are those of V3 and V5, with
-- only the lines marked `V6:` added or changed.

CREATE TABLE lease_history (
    fence       bigint      NOT NULL,
    resource    text        COLLATE "C" NOT NULL,
    acquired_at timestamptz NOT NULL,
    -- Moved by every renewal.
    expires_at  timestamptz NOT NULL,
    -- The release time ('released'), or the expiry ('taken_over'); NULL while no end is
    -- recorded.
    ended_at    timestamptz,
    end_kind    text,
    renewals    integer     NOT NULL DEFAULT 0,
    CONSTRAINT lease_history_pkey PRIMARY KEY (fence),
    CONSTRAINT lease_history_end_kind CHECK (end_kind IN ('released', 'taken_over')),
    CONSTRAINT lease_history_ended CHECK ((end_kind IS NULL) = (ended_at IS NULL))
);

-- A resource's history, newest first: a range scan.
CREATE INDEX lease_history_resource_fence_idx ON lease_history (resource, fence DESC);
-- The retention purge: leases that ended long ago (released, or expired).
CREATE INDEX lease_history_ended_idx ON lease_history ((coalesce(ended_at, expires_at)));

-- The leases that exist now start their history.
INSERT INTO lease_history (fence, resource, acquired_at, expires_at)
SELECT fence, resource, acquired_at, expires_at FROM leases;

-- A lease that ends by expiry keeps other owners out for this long after its expiry.
ALTER TABLE leases ADD COLUMN lock_delay_ms integer NOT NULL DEFAULT 0;

-- When another owner may take a resource whose lease expires at `p_expires_at` with
-- `p_lock_delay_ms`: the one place the lock delay's end is computed.
CREATE FUNCTION fencelock_free_at(p_expires_at timestamptz, p_lock_delay_ms integer)
RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
    SELECT p_expires_at + coalesce(p_lock_delay_ms, 0) * interval '1 millisecond'
$$;

-- A grant: the new lease's row, and the end of the lease it replaces (`p_replaced_fence`,
-- NULL when there was none): 'released' at the new acquisition time when it was live (only
-- its own owner can replace a live lease), 'taken_over' when it had expired and another owner
-- took it. An expired lease its own owner acquires again keeps no recorded end: it reads as
-- 'expired'.
CREATE FUNCTION fencelock_history_granted(
    p_resource text, p_fence bigint, p_acquired_at timestamptz, p_expires_at timestamptz,
    p_replaced_fence bigint, p_replaced_live boolean, p_same_owner boolean
) RETURNS void LANGUAGE sql VOLATILE AS $$
    UPDATE lease_history h
    SET end_kind = CASE WHEN p_replaced_live THEN 'released' ELSE 'taken_over' END,
        ended_at = CASE WHEN p_replaced_live THEN p_acquired_at ELSE h.expires_at END
    WHERE h.fence = p_replaced_fence AND h.end_kind IS NULL
      AND (p_replaced_live OR NOT p_same_owner);
    INSERT INTO lease_history (fence, resource, acquired_at, expires_at)
    VALUES (p_fence, p_resource, p_acquired_at, p_expires_at);
$$;

CREATE FUNCTION fencelock_history_renewed(p_fence bigint, p_expires_at timestamptz)
RETURNS void LANGUAGE sql VOLATILE AS $$
    UPDATE lease_history SET expires_at = p_expires_at, renewals = renewals + 1
    WHERE fence = p_fence
$$;

CREATE FUNCTION fencelock_history_released(p_fence bigint, p_released_at timestamptz)
RETURNS void LANGUAGE sql VOLATILE AS $$
    UPDATE lease_history SET end_kind = 'released', ended_at = p_released_at
    WHERE fence = p_fence AND end_kind IS NULL
$$;

-- Acquire, as in V3, with the lock delay (`p_lock_delay_ms`) and the history.
CREATE FUNCTION fencelock_acquire(
    p_resource text, p_owner text, p_ttl_seconds integer, p_deadline timestamptz,
    p_token text, p_max_leases integer, p_lock_delay_ms integer
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
                RETURN;
            END IF;
            PERFORM fencelock_in_time(p_deadline);
            UPDATE leases l
            SET owner = p_owner, fence = nextval('lease_fence'), acquired_at = stamp,
                expires_at = ends, token = p_token,
                lock_delay_ms = p_lock_delay_ms -- V6
            WHERE l.resource = p_resource
            RETURNING l.fence INTO granted;
            PERFORM fencelock_history_granted(p_resource, granted, stamp, ends, -- V6
                held_fence, held_until > now(), held_by = p_owner);
            RETURN QUERY SELECT granted, stamp, ends, now(),
                CASE WHEN held_until > now() THEN 'reacquired' ELSE 'taken_over' END;
            RETURN;
        END IF;
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
            RETURN QUERY SELECT granted, stamp, ends, now(), 'fresh'::text;
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- The six-argument form of V3 stays for instances of the previous build during a rolling
-- upgrade: it takes leases without a lock delay, and now records their history too.
CREATE OR REPLACE FUNCTION fencelock_acquire(
    p_resource text, p_owner text, p_ttl_seconds integer, p_deadline timestamptz,
    p_token text, p_max_leases integer
) RETURNS TABLE (
    fence bigint, acquired_at timestamptz, expires_at timestamptz, observed_at timestamptz,
    how text
)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM fencelock_acquire(p_resource, p_owner, p_ttl_seconds, p_deadline,
                                    p_token, p_max_leases, 0)
$$;

-- Group commit, as in V5, with each acquisition's lock delay (`p_lock_delays`, element `i`
-- for request `i`; NULL: none) and the history. Every rule of V5's comment holds.
CREATE FUNCTION fencelock_apply(
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

-- V5's eight-argument form stays for instances of the previous build during a rolling
-- upgrade: no lock delays, and the history recorded as by the new form.
CREATE OR REPLACE FUNCTION fencelock_apply(
    p_kinds text[], p_resources text[], p_owners text[], p_ttl_seconds integer[],
    p_fences bigint[], p_tokens text[], p_deadlines timestamptz[], p_lock_wait_ms integer
) RETURNS TABLE (
    ord integer, outcome text, fence bigint, acquired_at timestamptz, expires_at timestamptz,
    observed_at timestamptz
)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM fencelock_apply(p_kinds, p_resources, p_owners, p_ttl_seconds, p_fences,
                                  p_tokens, p_deadlines, p_lock_wait_ms, NULL::integer[])
$$;
