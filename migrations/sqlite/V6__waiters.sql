-- fencelock embedded store: waiting acquisitions (`wait_ms`).
--
-- A request that waits for a held resource takes a ticket here; AUTOINCREMENT never reuses a
-- number, and tickets are taken under the file's write lock, so every process sharing the
-- file sees one arrival order. While a live ticket is queued for a resource, only the waiter
-- at the head may be granted it (a re-acquisition by the live holder excepted). A ticket
-- lives until its wait ends (`expires_at`, Unix milliseconds); one left by a process that
-- died is skipped from then on, and purged later.
CREATE TABLE lease_waiters (
    ticket     INTEGER PRIMARY KEY AUTOINCREMENT,
    resource   TEXT    NOT NULL,
    expires_at INTEGER NOT NULL
);

-- The queue of one resource, in arrival order.
CREATE INDEX lease_waiters_resource_ticket_idx ON lease_waiters (resource, ticket);
