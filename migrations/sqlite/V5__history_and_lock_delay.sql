-- fencelock embedded store: the history of every resource's leases
-- (`GET /locks/{resource}/history`), and a lock delay kept with each lease (`lock_delay_ms` on
-- acquire).
--
-- History rows are written in the same transaction as the lease change they record. Only ends
-- that are final when they happen are written (a release, a live lease replaced by its
-- owner's re-acquisition, an expired lease taken over by another owner); whether a lease
-- without a recorded end is live or expired is read off `expires_at` against the clock when
-- the history is read, so expiry needs no write. Times are Unix milliseconds, as in V1.
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

-- The leases that exist now start their history.
INSERT INTO lease_history (fence, resource, acquired_at, expires_at)
SELECT fence, resource, acquired_at, expires_at FROM leases;

-- A lease that ends by expiry keeps other owners out for this long after its expiry.
ALTER TABLE leases ADD COLUMN lock_delay_ms INTEGER NOT NULL DEFAULT 0;
