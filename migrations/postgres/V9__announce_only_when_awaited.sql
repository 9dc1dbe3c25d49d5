-- fencelock: a lease change is announced only when someone waits for or watches its resource.
--
-- V7 announced every grant and release with `pg_notify`. PostgreSQL serialises the commits of
-- all transactions that notify: each takes one database-wide lock before it commits and
-- holds it until its commit record is flushed (`PreCommit_Notify`), so their disk syncs can
-- no longer be shared. Every lease change paid that, with or without a listener: measured
-- with pgbench running `fencelock_apply` (acquire, then release) at 16 clients, the
-- database did about 130 transactions/s with the V7 trigger and about 850 without it.
--
-- Now a lease change notifies only while its resource has a ticket in `lease_waiters` or a
-- registration in `lease_watchers` (a watch of this or any instance). Two index probes of
-- (nearly always) empty ranges cost nothing measurable.
--
-- That check can miss a waiter or watcher that registers while the change is being made, if
-- the registration was not yet committed when the trigger looked. So every registration
-- reads the lease row with a row lock in its own transaction (a waiter's `ENQUEUE`, a
-- watch's start), and acts on what it sees there: a change that had locked the row before
-- it is waited for and seen; one that locks it after it runs its trigger after the
-- registration committed, and announces. Only a lease appearing where there was no row has
-- no row to lock; there the registration sees no lease, which ends a watch at once and makes
-- a waiter try at once.
--
-- A ticket leaving a queue is still announced always (only waiting requests pay for it).

-- One row per running watch, deleted when the watch ends; left by an instance that died,
-- it is purged with the expired tickets.
CREATE TABLE lease_watchers (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource   text COLLATE "C" NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE INDEX lease_watchers_resource_idx ON lease_watchers (resource);

CREATE FUNCTION fencelock_announce_if_awaited() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    changed constant text := CASE TG_OP WHEN 'DELETE' THEN OLD.resource ELSE NEW.resource END;
BEGIN
    IF EXISTS (SELECT FROM lease_waiters w WHERE w.resource = changed)
       OR EXISTS (SELECT FROM lease_watchers w WHERE w.resource = changed) THEN
        PERFORM pg_notify('fencelock_changes', changed);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER leases_announce_change ON leases;

CREATE TRIGGER leases_announce_change
AFTER INSERT OR DELETE OR UPDATE OF fence ON leases
FOR EACH ROW EXECUTE FUNCTION fencelock_announce_if_awaited();
