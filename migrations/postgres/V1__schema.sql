-- fencelock: the whole PostgreSQL schema.
--
-- Any number of server instances share one database, and its clock decides. Every change of
-- a resource's lease is made by `fencelock_apply` while it holds the resource's advisory lock,
-- and is stamped with `clock_timestamp()` read once it holds every lock it needs, so commit
-- order and time stamps agree. Stamps are whole milliseconds; leases are half-open,
-- [acquired_at, expires_at). The reasons behind this shape are in docs/design/ (0009 for the
-- shape itself). From here on, migrations are appended, never edited.

-- Fences come from one sequence for all resources. Gaps are harmless. MAXVALUE 2^53 - 1 keeps
-- every fence exact in a JSON double; NO CYCLE makes exhaustion an error instead of a silent
-- restart at 1. CACHE 1 (the default): a cache would hand each session a range of its own,
-- and fences would no longer increase in the order they are issued (the server checks it).
CREATE SEQUENCE lease_fence AS bigint
    START WITH 1 MINVALUE 1 MAXVALUE 9007199254740991 NO CYCLE CACHE 1;

-- Every lease of every resource, one row per acquisition: the table is its own history. The
-- resource's current lease is its row not yet ended (`ended_at IS NULL`, at most one per
-- resource): live until `expires_at`, then expired until another acquisition or the purge
-- ends it. A release ends the row; nothing is deleted on the request path, so keeping the
-- history costs no second write. Names compare as bytes (`C`): listing with a prefix is a
-- range of the current rows' index, paged in the same order as the SQLite store.
CREATE TABLE leases (
    resource      text        COLLATE "C" NOT NULL,
    fence         bigint      NOT NULL,
    owner         text        NOT NULL,
    acquired_at   timestamptz NOT NULL,
    -- Moved by every renewal.
    expires_at    timestamptz NOT NULL,
    -- How the lease ended and when: 'released' (by its holder, or replaced by the holder's
    -- re-acquisition while live) at that moment; 'taken_over' (expired, then acquired by
    -- another owner), or 'expired' (acquired again by its own owner after expiry, or ended
    -- by the purge), at its expiry. NULL for the current lease.
    ended_at      timestamptz,
    end_kind      text,
    renewals      integer     NOT NULL DEFAULT 0,
    -- The name (never the secret) of the bearer token that took the lease, so that its
    -- `max_leases` quota is kept by the decision itself and every instance counts the same
    -- leases; NULL for a lease taken without a token.
    token         text,
    -- A lease that ends by expiry keeps other owners out for this long after its expiry.
    lock_delay_ms integer     NOT NULL DEFAULT 0,
    CONSTRAINT leases_pkey PRIMARY KEY (resource, fence),
    CONSTRAINT leases_fence_positive CHECK (fence > 0),
    CONSTRAINT leases_end_kind CHECK (end_kind IN ('released', 'taken_over', 'expired')),
    CONSTRAINT leases_ended CHECK ((end_kind IS NULL) = (ended_at IS NULL))
);

-- The current lease of each resource: unique, and the range a listing reads.
CREATE UNIQUE INDEX leases_current_idx ON leases (resource) WHERE ended_at IS NULL;
-- Current leases by expiry: the live count, and the purge of leases long expired. (The
-- second condition, implied by every comparison of `expires_at`, keeps the planner from
-- reading a lookup by resource off this index.)
CREATE INDEX leases_current_expires_idx ON leases (expires_at)
    WHERE ended_at IS NULL AND expires_at IS NOT NULL;
-- A token's current leases: the quota's count, a range of its own rows only.
CREATE INDEX leases_token_idx ON leases (token, expires_at)
    WHERE token IS NOT NULL AND ended_at IS NULL;
-- Rows are appended in acquisition order, so a block range index finds the old rows the
-- retention purge deletes, at almost no cost to each insert.
CREATE INDEX leases_acquired_brin ON leases USING brin (acquired_at);
-- The fence check at start (src/store/postgres/sequence.rs) asks whether any fence is at or
-- above the sequence's next value. Fences follow the order rows are appended, so block
-- summaries answer that from a few pages however long the history grows, and an insert into
-- a range not yet summarised writes nothing here (a B-tree would cost every acquisition one
-- more index write; a scan grows with the history).
CREATE INDEX leases_fence_brin ON leases USING brin (fence);

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
    -- quota, whose count is taken under the token's lock).
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

-- The advisory lock of a resource. Every change of a resource's lease, and every ticket or
-- watch registered for it, is made under this lock: it serialises them whether or not the
-- resource has a row, takes nothing from the WAL (a row lock is a write), and a registration
-- holding it shared keeps a change from slipping between its insert and its look.
CREATE FUNCTION fencelock_key(p_resource text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended(p_resource, 0)
$$;

-- When another owner may take a resource whose lease expires at `p_expires_at` with
-- `p_lock_delay_ms`: the one place the lock delay's end is computed. SQL and IMMUTABLE, so
-- that PostgreSQL inlines it into the expressions that call it.
CREATE FUNCTION fencelock_free_at(p_expires_at timestamptz, p_lock_delay_ms integer)
RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_expires_at + coalesce(p_lock_delay_ms, 0) * interval '1 millisecond'
$$;

-- Wake-ups. A change that can end a wait or a watch is announced on the channel
-- `fencelock_changes`, with the resource name as payload, in the transaction that makes it
-- (so it is delivered only if and when that commits): a lease granted or ended, and a ticket
-- leaving a queue, and a renewal that brings the expiry closer (waiters and watchers time
-- their next look by the expiry they read; one that moves it later ends no wait sooner, and
-- is not announced). PostgreSQL folds equal notifications of one transaction into one.
--
-- A notifying transaction commits under a database-wide lock held until its commit record is
-- flushed, so its disk sync cannot be shared: a lease change is announced only while its
-- resource has a ticket or a watch registered. `fencelock_apply` asks that itself, once per
-- change, under the resource's lock; the trigger below covers every other writer of lease rows.
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
-- asks the same question itself (it sets `fencelock.announcing` while it runs).
CREATE TRIGGER leases_announce_change
AFTER INSERT OR DELETE OR UPDATE OF ended_at ON leases
FOR EACH ROW
WHEN (current_setting('fencelock.announcing', true) IS DISTINCT FROM 'inline')
EXECUTE FUNCTION fencelock_announce_if_awaited();

-- A ticket leaving the queue moves everyone behind it; a granted ticket is no longer in the
-- queue, and its deletion moves no one.
CREATE TRIGGER lease_waiters_announce_change
AFTER DELETE ON lease_waiters
FOR EACH ROW WHEN (OLD.granted_fence IS NULL)
EXECUTE FUNCTION fencelock_announce_change();

-- One request as `fencelock_apply` judged it, and what its answer writes.
CREATE TYPE fencelock_decision AS (
    i             integer,
    kind          text,
    resource      text,
    owner         text,
    outcome       text,
    -- The current lease as judged.
    held_fence    bigint,
    held_since    timestamptz,
    held_until    timestamptz,
    free_at       timestamptz,
    -- When the queue ahead of an acquisition may change unannounced.
    queued        timestamptz,
    -- A new lease's expiry, or a renewal's.
    ends          timestamptz,
    -- The request's deadline: a write that comes later is not made.
    deadline      timestamptz,
    token         text,
    delay         integer,
    ticket        bigint,
    -- The ticket holds a grant, its expiry and lock delay for the waiter.
    granted       boolean,
    granted_until timestamptz,
    granted_delay integer,
    -- How and when the current lease ends.
    end_kind      text,
    end_at        timestamptz,
    -- The ticket leaves the queue.
    served        boolean,
    -- A release's hand-over: the ticket, the new holder, the provisional and the full expiry.
    head_ticket   bigint,
    head_owner    text,
    head_token    text,
    head_held     timestamptz,
    head_ends     timestamptz,
    head_delay    integer,
    -- The change is announced: someone waits or watches.
    announce      boolean
);

-- Raises `FL408` if the deadline of a request among `p_written` has passed: the last check
-- before a decision's commit. A write may have waited for a row that a transaction from
-- outside held (the resource's own lock is taken before any deadline is judged), and a
-- request answered `503` must not take effect later; the decision is then undone, and each
-- request made again on its own.
CREATE FUNCTION fencelock_in_time(p_resources text[], p_deadlines timestamptz[], p_written text[])
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF cardinality(p_written) > 0
       AND clock_timestamp() >= (SELECT min(x.deadline)
                                 FROM unnest(p_resources, p_deadlines) AS x(resource, deadline)
                                 WHERE x.resource = ANY (p_written)) THEN
        RAISE EXCEPTION 'the request''s deadline passed before its decision was committed'
            USING ERRCODE = 'FL408';
    END IF;
END
$$;

-- Raises unless `p_written` leases were written where `p_judged` were to be: a lease changed
-- between the decision's look and its write by a writer that did not take the resource's lock
-- (a person at a SQL prompt, say), or held its row until the request's deadline had passed.
-- The decision is then undone, and made again.
CREATE FUNCTION fencelock_as_judged(p_written bigint, p_judged bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_written <> p_judged THEN
        RAISE EXCEPTION 'a lease was changed or held from outside while it was decided'
            USING ERRCODE = 'FL409';
    END IF;
    RETURN true;
END
$$;

-- The lease decisions: every acquisition, renewal and release, and a waiter leaving its
-- queue, for a batch of requests or a single one alike. Element `i` of every array is one
-- request; each resource appears at most once (the caller puts a second request for a
-- resource into the next batch), so the requests are independent and are decided together,
-- by set-based statements.
--
-- Locks. First the advisory locks of the tokens whose quota an acquisition must keep, then
-- those of the resources, each kind in the order of its key: every decision takes its locks
-- in one global order, so two decisions can never wait on each other in a cycle. Then the
-- stamp is read, and every request is judged on the state every earlier decision on its
-- resource committed. `p_lock_wait_ms` bounds each wait for a lock (0: no bound): a row held
-- by a transaction from outside would otherwise hold up every request of the batch; the
-- caller then decides each request on its own.
--
-- Kinds and answers (`outcome`, with the lease where there is one):
--   acquire: 'fresh', 'reacquired', 'taken_over' (a new lease); 'claimed' (a waiter takes the
--            lease a release granted its ticket); 'held' (`expires_at`: when the caller
--            might get it; `acquired_at`: the expiry, when a lock delay refused it);
--            'quota_exceeded'; 'too_late'
--   renew:   'renewed', 'not_found', 'expired', 'owner_mismatch', 'stale_fence' (with the
--            lease's fence), 'too_late'
--   release: 'released' (with the released lease's fence and acquisition time; released at
--            `observed_at`), 'not_found', 'not_owner', 'stale_fence', 'too_late'
--   leave:   'claimed' (the waiter's ticket had been granted the lease, and the grant
--            stands), 'left'
-- `observed_at` is the decision's stamp. A refusal is an answer, and so is a deadline that
-- has passed when a request is about to be written ('too_late', judged after the locks):
-- one late request does not undo the others.
--
-- Waiting. An acquisition with a ticket (a waiter's) first takes a grant a release wrote into
-- its ticket, if the lease is still its own and live; a grant that ran out is undone, and the
-- waiter competes like anyone, behind the live tickets ahead of its own. A release hands the
-- lease to the first live ticket of the resource that left its acquisition: a new lease, and
-- the grant written into the ticket. A waiter with a heartbeat holds it provisionally (2 s at
-- most, no lock delay) until it takes it, so that a grant to a waiter that is gone frees the
-- resource soon. A ticket without an acquisition (a quota's) is not served: its waiter is
-- woken by the release and tries itself.
--
-- Call it as a statement of its own, outside an explicit transaction: its check of each
-- deadline and its commit are then one step.
CREATE FUNCTION fencelock_apply(
    p_kinds text[], p_resources text[], p_owners text[], p_ttl_seconds integer[],
    p_fences bigint[], p_tokens text[], p_max_leases integer[], p_tickets bigint[],
    p_lock_delays integer[], p_deadlines timestamptz[], p_lock_wait_ms integer
) RETURNS TABLE (
    ord integer, outcome text, fence bigint, acquired_at timestamptz, expires_at timestamptz,
    observed_at timestamptz
)
LANGUAGE plpgsql VOLATILE
-- Plans made once for the session, each a chain of index lookups whatever the table's size
-- when it was made (`fencelock_decision` arrays look small to the planner, and are).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET fencelock.announcing = 'inline'
AS $$
#variable_conflict use_column
DECLARE
    stamp timestamptz;
    keys bigint[];
    decisions fencelock_decision[];
    to_end bigint;
    to_extend bigint;
    to_grant boolean;
    to_tickets boolean;
    to_announce boolean;
    written bigint;
    new_resources text[];
    new_fences bigint[];
    done text[] := '{}';
    plain_resources text[];
    plain_fences bigint[];
    plain_sinces timestamptz[];
    plain_untils timestamptz[];
BEGIN
    -- Per transaction, so that they hold behind a pooler too: a fence is answered only once
    -- its commit is durable, and no lock is waited for longer than the caller allows.
    PERFORM set_config('synchronous_commit', 'on', true),
            set_config('lock_timeout', p_lock_wait_ms::text, true);
    keys := ARRAY(SELECT DISTINCT fencelock_key(r) FROM unnest(p_resources) r ORDER BY 1);
    IF cardinality(keys) < cardinality(p_resources)
       AND (SELECT count(DISTINCT r) FROM unnest(p_resources) r) < cardinality(p_resources) THEN
        RAISE EXCEPTION 'fencelock_apply: a resource appears twice in one batch';
    END IF;
    IF cardinality(array_remove(p_max_leases, NULL)) > 0 THEN
        -- A quota counts the token's leases as earlier decisions left them: one acquisition
        -- under a quota per token and batch.
        IF EXISTS (SELECT FROM unnest(p_tokens, p_max_leases) AS q(t, m)
                   WHERE m IS NOT NULL GROUP BY t HAVING count(*) > 1) THEN
            RAISE EXCEPTION 'fencelock_apply: two acquisitions under one token''s quota in one batch';
        END IF;
        PERFORM pg_advisory_xact_lock(0, k)
        FROM unnest(ARRAY(SELECT DISTINCT hashtext(t) FROM unnest(p_tokens, p_max_leases) AS q(t, m)
                          WHERE m IS NOT NULL ORDER BY 1)) AS k;
    END IF;
    PERFORM pg_advisory_xact_lock(k) FROM unnest(keys) AS k;
    stamp := date_trunc('milliseconds', clock_timestamp());

    -- The plain cases first, each kind in one statement that decides and writes: an
    -- acquisition of a resource without a lease that nobody waits for or watches, a release or
    -- a renewal by the live holder, with nobody waiting or watching for a release or a
    -- renewal that brings the expiry closer (which are announced). The
    -- conditions are those under which the rules below say the same, and they are evaluated
    -- on the rows as they are when written. Every other request is judged below.
    IF 'acquire' = ANY (p_kinds) THEN
        WITH granted AS (
            INSERT INTO leases AS l (resource, fence, owner, acquired_at, expires_at, token,
                                     lock_delay_ms)
            SELECT q.resource, nextval('lease_fence'), q.owner, stamp,
                   stamp + q.ttl * interval '1 second', q.token, coalesce(q.delay, 0)
            FROM unnest(p_kinds, p_resources, p_owners, p_ttl_seconds, p_tokens, p_max_leases,
                        p_tickets, p_lock_delays, p_deadlines)
                 AS q(kind, resource, owner, ttl, token, max_leases, ticket, delay, deadline)
            WHERE q.kind = 'acquire' AND q.ticket IS NULL AND q.max_leases IS NULL
              AND clock_timestamp() < q.deadline
              AND NOT EXISTS (SELECT FROM leases c
                              WHERE c.resource = q.resource AND c.ended_at IS NULL)
              AND NOT EXISTS (SELECT FROM lease_waiters w WHERE w.resource = q.resource)
              AND NOT EXISTS (SELECT FROM lease_watchers w WHERE w.resource = q.resource)
            RETURNING l.resource, l.fence, l.expires_at
        )
        SELECT array_agg(g.resource), array_agg(g.fence), array_agg(g.expires_at)
        INTO plain_resources, plain_fences, plain_untils
        FROM granted g;
        IF plain_resources IS NOT NULL THEN
            RETURN QUERY
            SELECT array_position(p_resources, x.r)::integer, 'fresh'::text, x.f, stamp, x.u,
                   stamp
            FROM unnest(plain_resources, plain_fences, plain_untils) AS x(r, f, u);
            done := plain_resources;
        END IF;
    END IF;
    IF 'release' = ANY (p_kinds) OR 'renew' = ANY (p_kinds) THEN
        WITH changed AS (
            UPDATE leases l
            SET ended_at = CASE WHEN q.kind = 'release' THEN stamp END,
                end_kind = CASE WHEN q.kind = 'release' THEN 'released' END,
                expires_at = CASE WHEN q.kind = 'renew' THEN stamp + q.ttl * interval '1 second'
                                  ELSE l.expires_at END,
                renewals = l.renewals + CASE WHEN q.kind = 'renew' THEN 1 ELSE 0 END
            FROM unnest(p_kinds, p_resources, p_owners, p_ttl_seconds, p_fences, p_deadlines)
                 AS q(kind, resource, owner, ttl, given, deadline)
            WHERE q.kind IN ('release', 'renew') AND l.resource = q.resource
              AND l.ended_at IS NULL AND l.owner = q.owner AND l.expires_at > stamp
              AND (q.given IS NULL OR q.given = l.fence) AND clock_timestamp() < q.deadline
              AND (q.kind = 'renew' AND stamp + q.ttl * interval '1 second' >= l.expires_at
                   OR NOT EXISTS (SELECT FROM lease_waiters w WHERE w.resource = q.resource)
                      AND NOT EXISTS (SELECT FROM lease_watchers w
                                      WHERE w.resource = q.resource))
            RETURNING l.resource, l.fence, l.acquired_at, l.expires_at, l.ended_at IS NULL
        )
        SELECT array_agg(c.resource), array_agg(c.fence), array_agg(c.acquired_at),
               array_agg(CASE WHEN c.renewed THEN c.expires_at END)
        INTO plain_resources, plain_fences, plain_sinces, plain_untils
        FROM changed AS c(resource, fence, acquired_at, expires_at, renewed);
        IF plain_resources IS NOT NULL THEN
            RETURN QUERY
            SELECT array_position(p_resources, x.r)::integer,
                   CASE WHEN x.u IS NULL THEN 'released' ELSE 'renewed' END, x.f, x.a, x.u,
                   stamp
            FROM unnest(plain_resources, plain_fences, plain_sinces, plain_untils)
                 AS x(r, f, a, u);
            done := done || plain_resources;
        END IF;
    END IF;
    IF cardinality(done) = cardinality(p_resources) THEN
        PERFORM fencelock_in_time(p_resources, p_deadlines, done);
        RETURN;
    END IF;

    -- Judge every request on the state its resource's earlier decisions committed: the
    -- current lease, the ticket, the queue, the quota, in the contract's order of checks;
    -- then what each answer writes.
    SELECT array_agg(x ORDER BY (x).i),
           count(*) FILTER (WHERE (x).end_kind IS NOT NULL),
           count(*) FILTER (WHERE (x).outcome IN ('renewed', 'claimed')),
           coalesce(bool_or((x).outcome IN ('fresh', 'reacquired', 'taken_over')
                            OR (x).head_ticket IS NOT NULL), false),
           coalesce(bool_or((x).ticket IS NOT NULL OR (x).head_ticket IS NOT NULL), false),
           coalesce(bool_or((x).announce), false)
    INTO decisions, to_end, to_extend, to_grant, to_tickets, to_announce
    FROM (
        SELECT ROW(j.i, j.kind, j.resource, j.owner, j.outcome, j.held_fence, j.held_since,
                   j.held_until, j.free_at, j.queued, j.ends, j.deadline, j.token, j.delay,
                   j.ticket,
                   j.granted, j.granted_until, j.granted_delay,
                   CASE
                       WHEN j.outcome IN ('reacquired', 'released') THEN 'released'
                       WHEN j.outcome = 'taken_over' AND j.held_by <> j.owner THEN 'taken_over'
                       WHEN j.outcome = 'taken_over' THEN 'expired'
                   END,
                   CASE WHEN j.outcome IN ('reacquired', 'released') THEN stamp
                        ELSE j.held_until END,
                   j.ticket IS NOT NULL AND (j.kind = 'leave'
                       OR j.outcome IN ('claimed', 'fresh', 'reacquired', 'taken_over')),
                   h.ticket, h.owner, h.token,
                   -- A waiter with a heartbeat holds the grant only until it takes it: 2 s
                   -- at most, and without its lock delay.
                   CASE WHEN h.wait_until IS NOT NULL
                        THEN least(stamp + h.ttl_seconds * interval '1 second',
                                   stamp + interval '2 seconds')
                        ELSE stamp + h.ttl_seconds * interval '1 second' END,
                   stamp + h.ttl_seconds * interval '1 second',
                   CASE WHEN h.wait_until IS NOT NULL THEN 0
                        ELSE coalesce(h.lock_delay_ms, 0) END,
                   (j.outcome IN ('fresh', 'reacquired', 'taken_over', 'released')
                    OR j.outcome = 'renewed' AND j.ends < j.held_until)
                       AND EXISTS (SELECT FROM lease_waiters w WHERE w.resource = j.resource
                                   UNION ALL
                                   SELECT FROM lease_watchers w WHERE w.resource = j.resource)
               )::fencelock_decision AS x
        FROM (
            SELECT s.*,
                CASE s.kind
                WHEN 'acquire' THEN CASE
                    WHEN s.grant_stands AND clock_timestamp() >= s.deadline THEN 'too_late'
                    WHEN s.grant_stands THEN 'claimed'
                    WHEN s.max_leases IS NOT NULL
                         AND (SELECT count(*) FROM leases o
                              WHERE o.token = s.token AND o.ended_at IS NULL
                                AND o.expires_at > stamp - interval '60 seconds'
                                AND fencelock_free_at(o.expires_at, o.lock_delay_ms) > stamp
                                AND o.resource <> s.resource) >= s.max_leases
                        THEN 'quota_exceeded'
                    WHEN s.present AND s.held_by <> s.owner AND s.free_at > stamp THEN 'held'
                    -- Nobody else may take a lease inside its lock delay, the waiters
                    -- included: its own owner acquires it ahead of the queue.
                    WHEN NOT s.live AND s.queued IS NOT NULL
                         AND NOT coalesce(s.held_by = s.owner AND s.free_at > stamp, false)
                        THEN 'queued'
                    WHEN clock_timestamp() >= s.deadline THEN 'too_late'
                    WHEN NOT s.present THEN 'fresh'
                    WHEN s.live THEN 'reacquired'
                    ELSE 'taken_over' END
                WHEN 'renew' THEN CASE
                    WHEN NOT s.present THEN 'not_found'
                    WHEN NOT s.live THEN 'expired'
                    WHEN s.held_by <> s.owner THEN 'owner_mismatch'
                    WHEN s.given IS NOT NULL AND s.given <> s.held_fence THEN 'stale_fence'
                    WHEN clock_timestamp() >= s.deadline THEN 'too_late'
                    ELSE 'renewed' END
                WHEN 'release' THEN CASE
                    WHEN NOT s.live THEN 'not_found'
                    WHEN s.held_by <> s.owner THEN 'not_owner'
                    WHEN s.given IS NOT NULL AND s.given <> s.held_fence THEN 'stale_fence'
                    WHEN clock_timestamp() >= s.deadline THEN 'too_late'
                    ELSE 'released' END
                WHEN 'leave' THEN CASE WHEN s.grant_stands THEN 'claimed' ELSE 'left' END
                END AS outcome
            FROM (
                SELECT q.i::integer AS i, q.kind, q.resource, q.owner, q.given, q.token,
                       q.max_leases, q.ticket, coalesce(q.delay, 0) AS delay, q.deadline,
                       stamp + q.ttl * interval '1 second' AS ends,
                       l.fence IS NOT NULL AS present,
                       coalesce(l.expires_at > stamp, false) AS live,
                       l.owner AS held_by, l.fence AS held_fence, l.acquired_at AS held_since,
                       l.expires_at AS held_until,
                       fencelock_free_at(l.expires_at, l.lock_delay_ms) AS free_at,
                       t.granted_fence IS NOT NULL AS granted,
                       coalesce(t.granted_fence = l.fence AND l.expires_at > stamp, false)
                           AS grant_stands,
                       t.granted_until, coalesce(t.lock_delay_ms, 0) AS granted_delay,
                       -- The earliest heartbeat among the live tickets ahead (all of them,
                       -- for a request without one): when the queue may change unannounced.
                       CASE WHEN q.kind = 'acquire' AND NOT coalesce(l.expires_at > stamp, false)
                       THEN (SELECT min(w.expires_at) FROM lease_waiters w
                             WHERE w.resource = q.resource AND w.expires_at > stamp
                               AND w.granted_fence IS NULL
                               AND (q.ticket IS NULL OR w.ticket < q.ticket))
                       END AS queued
                FROM unnest(p_kinds, p_resources, p_owners, p_ttl_seconds, p_fences, p_tokens,
                            p_max_leases, p_tickets, p_lock_delays, p_deadlines)
                     WITH ORDINALITY AS q(kind, resource, owner, ttl, given, token, max_leases,
                                          ticket, delay, deadline, i)
                LEFT JOIN LATERAL (
                    SELECT c.owner, c.fence, c.acquired_at, c.expires_at, c.lock_delay_ms
                    FROM leases c WHERE c.resource = q.resource AND c.ended_at IS NULL
                ) l ON true
                LEFT JOIN LATERAL (
                    SELECT w.granted_fence, w.granted_until, w.lock_delay_ms
                    FROM lease_waiters w WHERE w.ticket = q.ticket
                ) t ON true
                WHERE q.resource <> ALL (done)
            ) s
        ) j
        -- The head of the queue, for a release's hand-over: the first live ticket that left
        -- its acquisition (one without, a quota's, is woken and tries itself).
        LEFT JOIN LATERAL (
            SELECT w.ticket, w.owner, w.ttl_seconds, w.token, w.lock_delay_ms, w.wait_until
            FROM lease_waiters w
            WHERE j.outcome = 'released' AND w.resource = j.resource
              AND w.granted_fence IS NULL AND w.expires_at > stamp
            ORDER BY w.ticket
            LIMIT 1
        ) h ON h.owner IS NOT NULL
    ) judged;

    -- Each write names the lease as it was judged, and is made only before its deadline: a
    -- row a writer from outside (one that does not take the resource's lock) changed or held
    -- meanwhile is not written, and the decision is undone with an error, to be made again.
    IF to_end > 0 THEN
        UPDATE leases l SET ended_at = d.end_at, end_kind = d.end_kind
        FROM unnest(decisions) d
        WHERE d.end_kind IS NOT NULL AND l.resource = d.resource AND l.fence = d.held_fence
          AND l.ended_at IS NULL AND l.expires_at = d.held_until
          AND clock_timestamp() < d.deadline;
        GET DIAGNOSTICS written = ROW_COUNT;
        PERFORM fencelock_as_judged(written, to_end);
    END IF;
    IF to_extend > 0 THEN
        UPDATE leases l
        SET expires_at = CASE WHEN d.outcome = 'renewed' THEN d.ends ELSE d.granted_until END,
            renewals = l.renewals + CASE WHEN d.outcome = 'renewed' THEN 1 ELSE 0 END,
            lock_delay_ms = CASE WHEN d.outcome = 'renewed' THEN l.lock_delay_ms
                                 ELSE d.granted_delay END
        FROM unnest(decisions) d
        WHERE d.outcome IN ('renewed', 'claimed') AND l.resource = d.resource
          AND l.fence = d.held_fence AND l.ended_at IS NULL AND l.expires_at = d.held_until
          AND clock_timestamp() < d.deadline;
        GET DIAGNOSTICS written = ROW_COUNT;
        PERFORM fencelock_as_judged(written, to_extend);
    END IF;
    -- New leases: the requests' own grants, and the releases' hand-overs, once the leases
    -- they replace have ended.
    IF to_grant THEN
        WITH granted AS (
            INSERT INTO leases AS l (resource, fence, owner, acquired_at, expires_at, token,
                                     lock_delay_ms)
            SELECT d.resource, nextval('lease_fence'),
                   CASE WHEN d.outcome = 'released' THEN d.head_owner ELSE d.owner END, stamp,
                   CASE WHEN d.outcome = 'released' THEN d.head_held ELSE d.ends END,
                   CASE WHEN d.outcome = 'released' THEN d.head_token ELSE d.token END,
                   CASE WHEN d.outcome = 'released' THEN d.head_delay ELSE d.delay END
            FROM unnest(decisions) d
            WHERE d.outcome IN ('fresh', 'reacquired', 'taken_over')
               OR d.outcome = 'released' AND d.head_ticket IS NOT NULL
            RETURNING l.resource, l.fence
        )
        SELECT array_agg(g.resource), array_agg(g.fence) INTO new_resources, new_fences
        FROM granted g;
    END IF;
    IF to_tickets THEN
        -- A hand-over is written into its ticket. A waiter served leaves the queue (its
        -- trigger wakes the next); a grant it could not take is undone, and its ticket is back
        -- in the queue at its place.
        UPDATE lease_waiters w
        SET granted_fence = n.fence, granted_at = stamp, granted_until = d.head_ends
        FROM unnest(decisions) d JOIN unnest(new_resources, new_fences) n(resource, fence)
             ON n.resource = d.resource
        WHERE d.outcome = 'released' AND w.ticket = d.head_ticket;
        DELETE FROM lease_waiters w USING unnest(decisions) d
        WHERE d.served AND w.ticket = d.ticket;
        UPDATE lease_waiters w
        SET granted_fence = NULL, granted_at = NULL, granted_until = NULL
        FROM unnest(decisions) d
        WHERE d.granted AND NOT d.served AND w.ticket = d.ticket;
    END IF;
    IF to_announce THEN
        PERFORM pg_notify('fencelock_changes', d.resource) FROM unnest(decisions) d
        WHERE d.announce;
    END IF;
    IF to_end > 0 OR to_extend > 0 OR to_grant OR to_tickets THEN
        done := done || ARRAY(SELECT d.resource FROM unnest(decisions) d
                              WHERE d.end_kind IS NOT NULL OR d.served
                                 OR d.outcome IN ('fresh', 'renewed', 'claimed'));
    END IF;
    PERFORM fencelock_in_time(p_resources, p_deadlines, done);

    RETURN QUERY
    SELECT d.i,
           CASE d.outcome WHEN 'queued' THEN 'held' ELSE d.outcome END,
           CASE WHEN d.outcome IN ('fresh', 'reacquired', 'taken_over') THEN n.fence
                WHEN d.outcome IN ('renewed', 'stale_fence', 'released', 'claimed')
                    THEN d.held_fence END,
           CASE WHEN d.outcome IN ('fresh', 'reacquired', 'taken_over') THEN stamp
                WHEN d.outcome IN ('renewed', 'released', 'claimed') THEN d.held_since
                WHEN d.outcome = 'held' AND d.held_until <= stamp THEN d.held_until END,
           CASE WHEN d.outcome IN ('fresh', 'reacquired', 'taken_over', 'renewed') THEN d.ends
                WHEN d.outcome = 'claimed' THEN d.granted_until
                WHEN d.outcome = 'held' THEN d.free_at
                WHEN d.outcome = 'queued' THEN d.queued END,
           stamp
    FROM unnest(decisions) d
    LEFT JOIN unnest(new_resources, new_fences) n(resource, fence)
        ON n.resource = d.resource AND d.outcome <> 'released'
    ORDER BY d.i;
END
$$;

-- A new ticket at the end of `p_resource`'s queue, live for `p_wait_ms` by the database's
-- clock (its heartbeat `p_life_ms` at first), and whether the resource has a live lease,
-- read under the resource's lock once the ticket is in: a decision that was under way has
-- committed by then and is seen, and every later one sees the ticket and announces its
-- change. The row lock waits for a writer from outside as well.
--
-- Committed without waiting for the disk: a ticket lost in a crash of the database loses no
-- lease and no fence; its waiter, woken by the reconnect, tries again with the same number.
-- The acquisition goes with the ticket, for a release to grant it, unless it has a token
-- quota (`p_owner` NULL).
CREATE FUNCTION fencelock_enqueue(
    p_resource text, p_wait_ms bigint, p_life_ms bigint, p_owner text, p_ttl_seconds integer,
    p_token text, p_lock_delay_ms integer
) RETURNS TABLE (ticket bigint, live boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO lease_waiters AS w (resource, wait_until, expires_at, owner, ttl_seconds, token,
                                    lock_delay_ms)
    VALUES (p_resource, now() + p_wait_ms * interval '1 millisecond',
            now() + least(p_wait_ms, p_life_ms) * interval '1 millisecond',
            p_owner, p_ttl_seconds, p_token, p_lock_delay_ms)
    RETURNING w.ticket INTO ticket;
    PERFORM pg_advisory_xact_lock_shared(fencelock_key(p_resource));
    live := EXISTS (SELECT FROM leases l
                    WHERE l.resource = p_resource AND l.ended_at IS NULL
                      AND l.expires_at > clock_timestamp()
                    FOR SHARE);
    RETURN NEXT;
END
$$;

-- A watch's registration, live for `p_timeout_ms` by the database's clock, and the live
-- lease read under the resource's lock after it, as `fencelock_enqueue` does.
CREATE FUNCTION fencelock_watch(p_resource text, p_timeout_ms bigint)
RETURNS TABLE (id bigint, owner text, fence bigint, acquired_at timestamptz,
               expires_at timestamptz, observed_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO lease_watchers AS w (resource, expires_at)
    VALUES (p_resource, now() + p_timeout_ms * interval '1 millisecond')
    RETURNING w.id INTO id;
    PERFORM pg_advisory_xact_lock_shared(fencelock_key(p_resource));
    observed_at := date_trunc('milliseconds', clock_timestamp());
    SELECT l.owner, l.fence, l.acquired_at, l.expires_at
    INTO owner, fence, acquired_at, expires_at
    FROM leases l
    WHERE l.resource = p_resource AND l.ended_at IS NULL AND l.expires_at > observed_at
    FOR SHARE;
    RETURN NEXT;
END
$$;

-- Ends the current leases that expired more than `p_grace_ms` ago and whose lock delay has
-- passed as long ago, at most `p_limit` of them: they leave the current leases (a renewal
-- then answers not found) and stay in the history. A resource whose lock another decision
-- holds is skipped, not waited for, so the purge never closes a cycle with a decision; it
-- goes next time.
CREATE FUNCTION fencelock_end_expired(p_grace_ms bigint, p_limit bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ended bigint;
BEGIN
    UPDATE leases l SET ended_at = l.expires_at, end_kind = 'expired'
    FROM (
        SELECT c.resource, c.fence
        FROM (SELECT x.resource, x.fence FROM leases x
              WHERE x.ended_at IS NULL
                AND x.expires_at < now() - p_grace_ms * interval '1 millisecond'
                AND fencelock_free_at(x.expires_at, x.lock_delay_ms)
                    < now() - p_grace_ms * interval '1 millisecond'
              LIMIT p_limit OFFSET 0) c
        WHERE pg_try_advisory_xact_lock(fencelock_key(c.resource))
    ) old
    WHERE l.resource = old.resource AND l.fence = old.fence AND l.ended_at IS NULL;
    GET DIAGNOSTICS ended = ROW_COUNT;
    RETURN ended;
END
$$;

-- Trims the history of each resource acquired in the last `p_recent_ms` to its newest
-- `p_keep` leases (the purge calls it, never the request path): the recent rows are found by
-- the acquisition index, each resource's newest by its key. Only ended leases are deleted.
-- Returns how many rows it deleted.
CREATE FUNCTION fencelock_trim_history(p_keep integer, p_recent_ms bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    trimmed bigint;
BEGIN
    DELETE FROM leases h USING (
        SELECT r.resource,
               (SELECT x.fence FROM leases x WHERE x.resource = r.resource
                ORDER BY x.fence DESC OFFSET p_keep LIMIT 1) AS newest_dropped
        FROM (SELECT DISTINCT y.resource FROM leases y
              WHERE y.acquired_at > now() - p_recent_ms * interval '1 millisecond') r
    ) c
    WHERE h.resource = c.resource AND h.fence <= c.newest_dropped AND h.ended_at IS NOT NULL;
    GET DIAGNOSTICS trimmed = ROW_COUNT;
    RETURN trimmed;
END
$$;
