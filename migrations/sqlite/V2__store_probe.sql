-- One row that readiness rewrites: a read-only file or file system, or a full disk, fail
-- this write the way they would fail a lease change. It counts, because SQLite skips a write
-- that leaves a row as it was, and such a write would prove nothing.
CREATE TABLE store_probe (
    id     INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    writes INTEGER NOT NULL
);

INSERT INTO store_probe (id, writes) VALUES (1, 0);
