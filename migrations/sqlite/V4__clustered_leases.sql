-- fencelock embedded store: the lease table becomes clustered on its key (WITHOUT ROWID).
--
-- Every operation finds a lease by its resource name. As a rowid table, that was two b-tree
-- descents (the primary-key index, then the table) and a change wrote pages of both; now the
-- row lives in the key's own b-tree: one descent, fewer pages written per commit, and less for
-- each checkpoint to copy back, which is what slowed the store down as the table grew.
CREATE TABLE leases_clustered (
    resource    TEXT    NOT NULL PRIMARY KEY,
    owner       TEXT    NOT NULL,
    fence       INTEGER NOT NULL CHECK (fence > 0),
    acquired_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    token       TEXT
) WITHOUT ROWID;

INSERT INTO leases_clustered (resource, owner, fence, acquired_at, expires_at, token)
SELECT resource, owner, fence, acquired_at, expires_at, token FROM leases;

DROP TABLE leases;
ALTER TABLE leases_clustered RENAME TO leases;

CREATE INDEX leases_expires_at_idx ON leases (expires_at);
CREATE INDEX leases_token_expires_at_idx ON leases (token, expires_at) WHERE token IS NOT NULL;
