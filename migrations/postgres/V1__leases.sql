-- fencelock: the lease table and the store-wide fence sequence.
--
-- Fences come from one sequence for all resources: release deletes a row, so a per-row
-- counter would start again and re-issue fences a client may still hold. Gaps are harmless.
-- MAXVALUE 2^53 - 1 keeps every fence exact in a JSON double; NO CYCLE makes exhaustion an
-- error instead of a silent restart at 1.
CREATE SEQUENCE lease_fence AS bigint
    START WITH 1 MINVALUE 1 MAXVALUE 9007199254740991 NO CYCLE;

CREATE TABLE leases (
    resource    text        NOT NULL,
    owner       text        NOT NULL,
    fence       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    CONSTRAINT leases_pkey PRIMARY KEY (resource),
    CONSTRAINT leases_fence_positive CHECK (fence > 0)
);

-- The purge looks for leases that expired long ago.
CREATE INDEX leases_expires_at_idx ON leases (expires_at);
