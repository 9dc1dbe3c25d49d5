-- fencelock: a lease change looks for those who await it with one query instead of two.
--
-- Every insert, delete and fence change of a lease row runs `fencelock_announce_if_awaited`
-- (migration V9), which announced the change only if a waiter or a watcher was registered for
-- the resource: two `EXISTS` queries, each started and run as a statement of its own, for
-- every acquisition and every release. Under load PostgreSQL is bound by its CPU (see V14),
-- and those two statements were a large part of a decision's cost. One `EXISTS` over both
-- tables (`UNION ALL`: two index probes, ended at the first row found) answers the same
-- question. With pgbench running `fencelock_apply` (one request per transaction, acquire then
-- release, 16 clients, 5 s, four rounds alternated), the cycles per second went from 2,497,
-- 2,901, 3,061 and 3,045 with two queries to 3,210, 3,313, 3,445 and 3,223 with one, against
-- 3,429, 3,672, 3,746 and 3,314 with the trigger disabled.
CREATE OR REPLACE FUNCTION fencelock_announce_if_awaited() RETURNS trigger
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
