-- fencelock embedded store: the whole schema.
--
-- Times are Unix milliseconds on the server's clock (the precision the API shows). Every
-- write happens under the file's write lock (`BEGIN IMMEDIATE`), so every process sharing
-- the file sees one order of decisions. The reasons behind this shape are in
-- docs/design/0008-schema.md; from here on, migrations are appended, never edited.

-- The live lease of each resource. Clustered on its key (WITHOUT ROWID): every operation
-- finds a lease by its name, and a change writes the pages of one b-tree, not two.
CREATE TABLE leases (
    resource      TEXT    NOT NULL PRIMARY KEY,
    owner         TEXT    NOT NULL,
    fence         INTEGER NOT NULL CHECK (fence > 0),
    acquired_at   INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    -- The name (never the secret) of the bearer token that took the lease, so that its
    -- `max_leases` quota is counted in the grant's own transaction; NULL without a token.
    token         TEXT,
    -- A lease that ends by expiry keeps other owners out for this long after its expiry.
    lock_delay_ms INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- The purge looks for leases that expired long ago.
CREATE INDEX leases_expires_at_idx ON leases (expires_at);
-- A token's leases: a range scan of its own rows only.
CREATE INDEX leases_token_expires_at_idx ON leases (token, expires_at) WHERE token IS NOT NULL;

-- The store-wide fence counter, one row for all resources: a release deletes its lease row,
-- so a per-row counter would start again and re-issue fences a client may still hold.
CREATE TABLE fence_counter (
    id         INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    -- 2^53 - 1 keeps every fence exact in a JSON double
    last_fence INTEGER NOT NULL CHECK (last_fence >= 0 AND last_fence <= 9007199254740991)
);

INSERT INTO fence_counter (id, last_fence) VALUES (1, 0);

-- Every lease of every resource (`GET /locks/{resource}/history`), written in the same
-- transaction as the lease change it records. Only ends that are final when they happen are
-- written (a release, a live lease replaced by its owner's re-acquisition, an expired lease
-- taken over by another owner); whether a lease without a recorded end is live or expired is
-- read off `expires_at` against the clock when the history is read, so expiry needs no write.
CREATE TABLE lease_history (
    fence       INTEGER NOT NULL PRIMARY KEY,
    resource    TEXT    NOT NULL,
    acquired_at INTEGER NOT NULL,
    -- Moved by every renewal.
    expires_at  INTEGER NOT NULL,
    -- The release time ('released'), or the expiry ('taken_over'); NULL while no end is
    -- recorded.
    ended_at    INTEGER,
    end_kind    TEXT CHECK (end_kind IN ('released', 'taken_over')),
    renewals    INTEGER NOT NULL DEFAULT 0,
    CHECK ((end_kind IS NULL) = (ended_at IS NULL))
);

-- A resource's history, newest first: a range scan.
CREATE INDEX lease_history_resource_fence_idx ON lease_history (resource, fence DESC);
-- The retention purge: leases that ended long ago (released, or expired).
CREATE INDEX lease_history_ended_idx ON lease_history (coalesce(ended_at, expires_at));

-- Waiting acquisitions (`wait_ms`): one ticket per waiting request. AUTOINCREMENT never
-- reuses a number, and tickets are taken under the write lock, so every process sees one
-- arrival order. While a live ticket is queued for a resource, only the waiter at the head
-- may be granted it (a re-acquisition by the live holder excepted).
CREATE TABLE lease_waiters (
    ticket     INTEGER PRIMARY KEY AUTOINCREMENT,
    resource   TEXT    NOT NULL,
    -- The ticket's heartbeat, which every check of a live ticket reads: at most 2 s ahead,
    -- never past `wait_until`. Each server process extends all of its waiters' tickets every
    -- 500 ms while it has any, so the tickets of a process that died stop counting within
    -- 2 s; the purge deletes them later.
    expires_at INTEGER NOT NULL,
    -- The end of the wait. A ticket written without one (the tests' stand-in for a waiter
    -- of another process) lives until its `expires_at`.
    wait_until INTEGER
);

-- The queue of one resource, in arrival order.
CREATE INDEX lease_waiters_resource_ticket_idx ON lease_waiters (resource, ticket);

-- One row that readiness rewrites: a read-only file or file system, or a full disk, fail
-- this write the way they would fail a lease change. It counts, because SQLite skips a write
-- that leaves a row as it was, and such a write would prove nothing.
CREATE TABLE store_probe (
    id     INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    writes INTEGER NOT NULL
);

INSERT INTO store_probe (id, writes) VALUES (1, 0);
