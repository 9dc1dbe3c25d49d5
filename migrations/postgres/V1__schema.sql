-- fencelock: the whole PostgreSQL schema.
--
-- Any number of server instances share one database, and its clock decides: every decision
-- is stamped with `clock_timestamp()` read once it holds its resource's row lock, so commit
-- order and time stamps agree. Stamps are whole milliseconds; leases are half-open,
-- [acquired_at, expires_at). The reasons behind this shape, and what each choice was measured
-- to cost, are in docs/design/0008-schema.md. From here on, migrations are appended, never
-- edited.

-- Fences come from one sequence for all resources: a release deletes its row, so a per-row
-- counter would start again and re-issue fences a client may still hold. Gaps are harmless.
-- MAXVALUE 2^53 - 1 keeps every fence exact in a JSON double; NO CYCLE makes exhaustion an
-- error instead of a silent restart at 1.
CREATE SEQUENCE lease_fence AS bigint
    START WITH 1 MINVALUE 1 MAXVALUE 9007199254740991 NO CYCLE;

-- The live lease of each resource. Names compare as bytes (`C`): listing with a prefix is a
-- range of the primary key, paged in the same order as the SQLite store, whatever the
-- database's default collation.
CREATE TABLE leases (
    resource      text        COLLATE "C" NOT NULL,
    owner         text        NOT NULL,
    fence         bigint      NOT NULL,
    acquired_at   timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    -- The name (never the secret) of the bearer token that took the lease, so that its
    -- `max_leases` quota is kept by the decision itself and every instance counts the same
    -- leases; NULL for a lease taken without a token.
    token         text,
    -- A lease that ends by expiry keeps other owners out for this long after its expiry.
    lock_delay_ms integer     NOT NULL DEFAULT 0,
    CONSTRAINT leases_pkey PRIMARY KEY (resource),
    CONSTRAINT leases_fence_positive CHECK (fence > 0)
);

-- The purge looks for leases that expired long ago.
CREATE INDEX leases_expires_at_idx ON leases (expires_at);
-- A token's leases: a range scan of its own rows only.
CREATE INDEX leases_token_expires_at_idx ON leases (token, expires_at) WHERE token IS NOT NULL;

-- Every lease of every resource (`GET /locks/{resource}/history`), written in the same
-- transaction as the lease change it records. Only ends that are final when they happen are
-- written (a release, a live lease replaced by its owner's re-acquisition, an expired lease
-- taken over by another owner); whether a lease without a recorded end is live or expired is
-- read off `expires_at` when the history is read, so expiry needs no write. The room left in
-- each page (fillfactor) keeps a release's or renewal's update on its page, touching no index.
CREATE TABLE lease_history (
    fence       bigint      NOT NULL,
    resource    text        COLLATE "C" NOT NULL,
    -- Written once: the retention purge walks this column's index, never one the updates
    -- below change.
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
) WITH (fillfactor = 80);

-- A resource's history, newest first: a range scan.
CREATE INDEX lease_history_resource_fence_idx ON lease_history (resource, fence DESC);
-- The retention purge and the per-resource trim: the rows acquired before a cutoff.
CREATE INDEX lease_history_acquired_idx ON lease_history (acquired_at);

-- Waiting acquisitions (`wait_ms`): one ticket per waiting request. Tickets come from one
-- sequence, so every instance sees one arrival order. While a live ticket is queued for a
-- resource, the resource goes only to the waiter at the head (a re-acquisition by the live
-- holder is not a grant to someone else and is never held back).
CREATE SEQUENCE lease_waiter_ticket;

CREATE TABLE lease_waiters (
    ticket        bigint      PRIMARY KEY DEFAULT nextval('lease_waiter_ticket'),
    resource      text        COLLATE "C" NOT NULL,
    -- The ticket's heartbeat, which every check of a live ticket reads: at most 2 s ahead,
    -- never past `wait_until`. Each instance extends all of its waiters' tickets every
    -- 500 ms while it has any, so the tickets of an instance that died stop counting within
    -- 2 s; the purge deletes them later.
    expires_at    timestamptz NOT NULL,
    -- The acquisition the waiter leaves with its ticket, for a release to grant in its own
    -- transaction; NULL for a waiter that must try itself (an acquisition under a token
    -- quota, which counts the token's leases under its own lock).
    owner         text,
    ttl_seconds   integer,
    token         text,
    lock_delay_ms integer,
    -- The grant a release wrote into the ticket: the lease's fence, its start, and the
    -- expiry the waiter asked for. A granted ticket is no longer in the queue.
    granted_fence bigint,
    granted_at    timestamptz,
    granted_until timestamptz,
    -- The end of the wait. A ticket without one (the tests' stand-in for a waiter of another
    -- instance) lives until its `expires_at`, and a release grants it the full lease.
    wait_until    timestamptz
);

-- The queue of one resource, in arrival order.
CREATE INDEX lease_waiters_resource_ticket_idx ON lease_waiters (resource, ticket);

-- One row per running watch (`GET /locks/{resource}/watch`), so that a change is announced
-- only while someone awaits it; left by an instance that died, it is purged with the expired
-- tickets.
CREATE TABLE lease_watchers (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource   text        COLLATE "C" NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE INDEX lease_watchers_resource_idx ON lease_watchers (resource);

-- One row that readiness rewrites: a hot standby, a read-only database or a full disk fail
-- this write the way they would fail a lease change.
CREATE TABLE store_probe (
    id         integer     NOT NULL,
    checked_at timestamptz NOT NULL,
    CONSTRAINT store_probe_pkey PRIMARY KEY (id),
    CONSTRAINT store_probe_one_row CHECK (id = 1)
);

-- Raises `FL408` once the request's deadline (on this database's clock) has passed.
--
-- A request answered `503` must not take effect later. `statement_timeout` cannot promise
-- that: it starts when a statement reaches the server, and a statement held up in a network
-- partition arrives whole, long after its client gave up. Every write checks its deadline
-- right before it writes, after any row lock it waited for.
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

-- When another owner may take a resource whose lease expires at `p_expires_at` with
-- `p_lock_delay_ms`: the one place the lock delay's end is computed. SQL and STABLE (which
-- it is), so that PostgreSQL inlines it into the expressions that call it.
CREATE FUNCTION fencelock_free_at(p_expires_at timestamptz, p_lock_delay_ms integer)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT p_expires_at + coalesce(p_lock_delay_ms, 0) * interval '1 millisecond'
$$;

-- The helpers below are PL/pgSQL, not SQL: PostgreSQL plans a statement of a SQL function
-- that cannot be inlined on every call, while PL/pgSQL keeps its plans for the session.

-- NULL when no live ticket of `p_resource` is ahead of `p_ticket` (for a request without a
-- ticket, `p_ticket` NULL: when no live ticket is queued at all), as of `p_at`; otherwise the
-- first moment the queue may change without anyone saying so: the earliest `expires_at` of
-- the tickets ahead. A grant is allowed only while this is NULL.
CREATE FUNCTION fencelock_waiters_ahead(p_resource text, p_ticket bigint, p_at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT min(w.expires_at) FROM lease_waiters w
            WHERE w.resource = p_resource AND w.expires_at > p_at AND w.granted_fence IS NULL
              AND (p_ticket IS NULL OR w.ticket < p_ticket));
END
$$;

-- The waiter holding `p_ticket` got the lease: its ticket leaves the queue in the same
-- transaction. NULL (no ticket) does nothing.
CREATE FUNCTION fencelock_waiter_served(p_ticket bigint) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    DELETE FROM lease_waiters w WHERE w.ticket = p_ticket;
END
$$;

-- A grant's history: the new lease's row, and the end of the lease it replaces
-- (`p_replaced_fence`, NULL when there was none): 'released' at the new acquisition time when
-- it was live (only its own owner can replace a live lease), 'taken_over' when it had expired
-- and another owner took it. An expired lease its own owner acquires again keeps no recorded
-- end: it reads as 'expired'.
CREATE FUNCTION fencelock_history_granted(
    p_resource text, p_fence bigint, p_acquired_at timestamptz, p_expires_at timestamptz,
    p_replaced_fence bigint, p_replaced_live boolean, p_same_owner boolean
) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE lease_history h
    SET end_kind = CASE WHEN p_replaced_live THEN 'released' ELSE 'taken_over' END,
        ended_at = CASE WHEN p_replaced_live THEN p_acquired_at ELSE h.expires_at END
    WHERE h.fence = p_replaced_fence AND h.end_kind IS NULL
      AND (p_replaced_live OR NOT p_same_owner);
    INSERT INTO lease_history (fence, resource, acquired_at, expires_at)
    VALUES (p_fence, p_resource, p_acquired_at, p_expires_at);
END
$$;

-- The grant of lease `p_fence` of `p_resource`, written into a ticket by a release, becomes
-- the waiter's for good if that lease is still there and live (a provisional grant that ran
-- out is undone, and may have been taken by someone else): it gets the expiry and the lock
-- delay the waiter asked for, with a synchronous commit, since a commit lost in a crash would
-- take the lease back from a client told it holds it. Returns whether the grant stands; the
-- caller deletes or resets the ticket. A grant that already is the full lease (a ticket
-- without `wait_until`) writes nothing but the ticket, so its commit need not wait for the
-- disk.
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
-- `p_keep` leases (the purge calls it, never the request path): the recent rows are found by
-- the acquisition index, each resource's newest by its fence index. Returns how many rows it
-- deleted.
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

-- Wake-ups. A change that can end a wait or a watch is announced on the channel
-- `fencelock_changes`, with the resource name as payload, in the transaction that makes it
-- (so it is delivered only if and when that commits): a lease inserted, deleted (release,
-- purge), or given a new fence (a grant over an expired lease, a re-acquisition), and a
-- ticket leaving a queue. Renewals (only `expires_at` changes) are not announced: nobody's
-- wait ends by them. PostgreSQL folds equal notifications of one transaction into one.
--
-- A notifying transaction commits under a database-wide lock held until its commit record is
-- flushed, so its disk sync cannot be shared: a lease change is announced only while its
-- resource has a ticket or a watch registered. A registration reads the lease row with a row
-- lock in its own transaction and acts on what it sees, so a change it races either is seen
-- by it or runs its check after the registration committed.
CREATE FUNCTION fencelock_announce_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fencelock_changes',
        CASE TG_OP WHEN 'DELETE' THEN OLD.resource ELSE NEW.resource END);
    RETURN NULL;
END
$$;

CREATE FUNCTION fencelock_announce_if_awaited() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    changed constant text := CASE TG_OP WHEN 'DELETE' THEN OLD.resource ELSE NEW.resource END;
BEGIN
    IF EXISTS (SELECT FROM lease_waiters w WHERE w.resource = changed
               UNION ALL
               SELECT FROM lease_watchers w WHERE w.resource = changed) THEN
        PERFORM pg_notify('fencelock_changes', changed);
    END IF;
    RETURN NULL;
END
$$;

-- Every writer of lease rows announces through this trigger, except `fencelock_apply`, which
-- asks the same question itself once per request that changed a row (it sets
-- `fencelock.announcing` while it runs).
CREATE TRIGGER leases_announce_change
AFTER INSERT OR DELETE OR UPDATE OF fence ON leases
FOR EACH ROW
WHEN (current_setting('fencelock.announcing', true) IS DISTINCT FROM 'inline')
EXECUTE FUNCTION fencelock_announce_if_awaited();

-- A ticket leaving the queue moves everyone behind it; a granted ticket is no longer in the
-- queue, and its deletion moves no one.
CREATE TRIGGER lease_waiters_announce_change
AFTER DELETE ON lease_waiters
FOR EACH ROW WHEN (OLD.granted_fence IS NULL)
EXECUTE FUNCTION fencelock_announce_change();

-- Acquire one lease, alone: a waiter's attempt (`p_ticket`, its ticket; NULL for a request
-- that does not wait) or an acquisition under a token quota (`p_max_leases`). Everything else
-- is decided in batches by `fencelock_apply`, by the same rules.
--
-- The decision and the write happen in one transaction, with a fence drawn from the sequence
-- only when the lease is granted, after the row lock: a fence issued for a resource is always
-- greater than the fence of the lease it replaces, however requests interleave. With no row,
-- the insert races other inserts of the same resource; the loser sees the winner's row on its
-- next look and decides again.
--
-- With a quota, acquisitions by one token are serialised by a transaction-scoped advisory
-- lock on the token's name, taken before any row lock (the order is always token, then
-- resource): otherwise two acquisitions of different resources could each count the other's
-- lease as not yet there and both be granted past the quota. The count leaves out
-- `p_resource` itself (re-acquiring never counts twice), and counts a lease until its lock
-- delay has passed. It reads `now()`, the transaction's start: an earlier clock counts a lease
-- that has expired since, which refuses, never over-grants.
--
-- Returns one row, whose `how` names the event: 'fresh', 'reacquired' or 'taken_over' (with
-- the new lease); 'quota_exceeded'; or 'held', whose `expires_at` is when the caller might get
-- the resource (the end of the lease's lock delay, or when the queue ahead may change), for
-- waiters to arm a timer on, and whose `acquired_at` is the expired lease's expiry when the
-- refusal is a lock delay's (NULL otherwise).
CREATE FUNCTION fencelock_acquire(
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
    -- A waiter whose ticket a release has granted takes its lease, if the grant still
    -- stands (`fencelock_claim_grant`); one that was undone puts the ticket back in the queue
    -- at its place, and the waiter competes as any other.
    IF p_ticket IS NOT NULL THEN
        SELECT w.granted_fence, w.granted_at, w.granted_until, w.lock_delay_ms
        INTO granted, stamp, ends, held_delay
        FROM lease_waiters w
        WHERE w.ticket = p_ticket AND w.granted_fence IS NOT NULL
        FOR UPDATE;
        IF FOUND THEN
            IF fencelock_claim_grant(p_resource, granted, ends, held_delay) THEN
                DELETE FROM lease_waiters w WHERE w.ticket = p_ticket;
                RETURN QUERY SELECT granted, stamp, ends,
                    greatest(stamp, date_trunc('milliseconds', clock_timestamp())), 'fresh'::text;
                RETURN;
            END IF;
            UPDATE lease_waiters w
            SET granted_fence = NULL, granted_at = NULL, granted_until = NULL
            WHERE w.ticket = p_ticket;
        END IF;
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
                CASE WHEN held_until <= stamp THEN held_until END,
                fencelock_free_at(held_until, held_delay), stamp, 'held'::text;
            RETURN;
        END IF;
    END IF;
    IF p_token IS NOT NULL AND p_max_leases IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('fencelock.token:' || p_token, 0));
        -- A lease counts until its lock delay has passed. The first bound (the longest
        -- lock delay is 60 s) keeps the count a range scan of the token's expiry index.
        SELECT count(*) INTO others FROM leases l
        WHERE l.token = p_token AND l.expires_at > now() - interval '60 seconds'
          AND fencelock_free_at(l.expires_at, l.lock_delay_ms) > now()
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
                    CASE WHEN held_until <= stamp THEN held_until END,
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

-- Applies a batch of lease operations; element `i` of every array belongs to the same
-- request, and each is decided against the state the elements before it left.
--
-- Order. The caller gives the elements in ascending byte order of their resource (requests
-- for one resource in the order they were queued), and they are decided in that order; an
-- element out of order is an error. Every lease row this function locks, and every insertion
-- it waits for, is therefore taken in one global order, and two batches running at once can
-- never wait on each other in a cycle. `fencelock_acquire` locks at most one lease row (under
-- a quota it takes its token's advisory lock first, which no batch takes), and the purge
-- skips locked rows, so nothing else can close a cycle either.
--
-- An acquisition first reads the lease without a lock: a row lock is a write, logged, waited
-- for by the commit's disk sync, and it would hold up the holder's own release; a lease
-- another owner holds (lock delay included) is the answer as of that read. An expired lease
-- or the caller's own is decided under the row lock; where there was no lease there is no row
-- to lock, so the read stands and the insert follows (a concurrent insert makes it look
-- again).
--
-- A release hands the lease to the first live ticket of the resource that left its
-- acquisition, in the release's own transaction: new fence, history, and the grant written
-- into the ticket. A waiter with a heartbeat gets a provisional lease (2 s at most, no lock
-- delay) until it claims it (`fencelock_claim_grant`), so that a grant to a waiter that is
-- gone frees the resource soon.
--
-- Nothing here raises for one element: a refusal is an outcome, and so is a deadline that
-- has passed when the element is about to be written ('too_late', checked after the row lock
-- as `fencelock_in_time` is), so one late request does not undo the others. An error (a
-- statement timeout, a lock wait past `p_lock_wait_ms`) rolls the whole batch back; the caller
-- then decides each request on its own. `p_lock_wait_ms` bounds each wait for a row lock (0:
-- no bound) for the rest of the transaction: a lease row held by a transaction from outside
-- would otherwise hold up every request of the batch. Call it as a statement of its own,
-- outside an explicit transaction.
--
-- Returns one row per element: `ord`, its index in the arrays (1-based), and `outcome`:
--   acquire: 'fresh', 'reacquired', 'taken_over' (with the new lease), 'held' (with when the
--            caller might get it, and the expiry if a lock delay refused it), 'too_late'
--   renew:   'renewed' (with the lease), 'not_found', 'expired', 'owner_mismatch',
--            'stale_fence' (with the lease's fence), 'too_late'
--   release: 'released' (with the released lease's fence and acquisition time; released at
--            `observed_at`), 'not_found', 'not_owner', 'stale_fence' (with the lease's
--            fence), 'too_late'
-- `observed_at` is the decision's stamp.
CREATE FUNCTION fencelock_apply(
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
    head_beats boolean;
    head_held timestamptz;
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
                acquired_at := CASE WHEN held_until <= stamp THEN held_until END;
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
                    acquired_at := CASE WHEN held_until <= stamp THEN held_until END;
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
                    -- The first waiter in the queue gets the lease in this very
                    -- transaction, if it left its acquisition with its ticket.
                    SELECT w.ticket, w.owner, w.ttl_seconds, w.token, w.lock_delay_ms,
                           w.wait_until IS NOT NULL
                    INTO head_ticket, head_owner, head_ttl, head_token, head_delay,
                         head_beats
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
                        -- A waiter with a heartbeat holds the grant only until it takes
                        -- it (`fencelock_claim_grant`): 2 s at most, and without its lock
                        -- delay, so that a grant nobody takes frees the resource soon.
                        head_held := CASE WHEN head_beats
                            THEN least(head_ends, stamp + interval '2 seconds')
                            ELSE head_ends END;
                        UPDATE leases l
                        SET owner = head_owner, fence = nextval('lease_fence'),
                            acquired_at = stamp, expires_at = head_held, token = head_token,
                            lock_delay_ms = CASE WHEN head_beats THEN 0 ELSE head_delay END
                        WHERE l.resource = v_resource
                        RETURNING l.fence INTO granted;
                        changed := true;
                        INSERT INTO lease_history (fence, resource, acquired_at, expires_at)
                        VALUES (granted, v_resource, stamp, head_held);
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
