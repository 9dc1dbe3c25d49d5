-- fencelock embedded store: the lease table and the store-wide fence counter.
--
-- Times are Unix milliseconds on the server's clock (the precision the API shows).
-- The fence counter is one row for all resources: release deletes a lease row, so a per-row
-- counter would start again and re-issue fences a client may still hold.
CREATE TABLE leases (
    resource    TEXT    NOT NULL PRIMARY KEY,
    owner       TEXT    NOT NULL,
    fence       INTEGER NOT NULL CHECK (fence > 0),
    acquired_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);

-- The purge looks for leases that expired long ago.
CREATE INDEX leases_expires_at_idx ON leases (expires_at);

CREATE TABLE fence_counter (
    id         INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    -- 2^53 - 1 keeps every fence exact in a JSON double
    last_fence INTEGER NOT NULL CHECK (last_fence >= 0 AND last_fence <= 9007199254740991)
);

INSERT INTO fence_counter (id, last_fence) VALUES (1, 0);
