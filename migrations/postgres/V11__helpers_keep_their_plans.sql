-- fencelock: the helpers the decisions call are PL/pgSQL, so their statements are planned once
-- per session, not on every call.
--
-- PostgreSQL (before 18) plans a statement of a `LANGUAGE sql` function anew on every call
-- that cannot be inlined, and calls from PL/pgSQL are not inlined. With track_functions on,
-- pgbench running `fencelock_apply` (acquire, then release) at one client showed each call
-- of `fencelock_waiters_ahead`, `fencelock_history_granted` and `fencelock_history_released`
-- at 0.10 to 0.12 ms, more than half of the whole decision's time, for an index probe of an
-- empty range, one insert and one update. PL/pgSQL keeps the plans of its statements for the
-- session. Bodies, signatures and answers are unchanged.
--
-- `fencelock_free_at` stays SQL: an expression without a table, inlined where it is called.

CREATE OR REPLACE FUNCTION fencelock_waiters_ahead(p_resource text, p_ticket bigint, p_at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT min(w.expires_at) FROM lease_waiters w
            WHERE w.resource = p_resource AND w.expires_at > p_at AND w.granted_fence IS NULL
              AND (p_ticket IS NULL OR w.ticket < p_ticket));
END
$$;

CREATE OR REPLACE FUNCTION fencelock_waiters_ahead(p_resource text, p_ticket bigint)
RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN fencelock_waiters_ahead(p_resource, p_ticket, now());
END
$$;

CREATE OR REPLACE FUNCTION fencelock_waiter_served(p_ticket bigint) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    DELETE FROM lease_waiters w WHERE w.ticket = p_ticket;
END
$$;

CREATE OR REPLACE FUNCTION fencelock_history_granted(
    p_resource text, p_fence bigint, p_acquired_at timestamptz, p_expires_at timestamptz,
    p_replaced_fence bigint, p_replaced_live boolean, p_same_owner boolean
) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE lease_history h
    SET end_kind = CASE WHEN p_replaced_live THEN 'released' ELSE 'taken_over' END,
        ended_at = CASE WHEN p_replaced_live THEN p_acquired_at ELSE h.expires_at END
    WHERE h.fence = p_replaced_fence AND h.end_kind IS NULL
      AND (p_replaced_live OR NOT p_same_owner);
    INSERT INTO lease_history (fence, resource, acquired_at, expires_at)
    VALUES (p_fence, p_resource, p_acquired_at, p_expires_at);
END
$$;

CREATE OR REPLACE FUNCTION fencelock_history_renewed(p_fence bigint, p_expires_at timestamptz)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE lease_history h SET expires_at = p_expires_at, renewals = h.renewals + 1
    WHERE h.fence = p_fence;
END
$$;

CREATE OR REPLACE FUNCTION fencelock_history_released(p_fence bigint, p_released_at timestamptz)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE lease_history h SET end_kind = 'released', ended_at = p_released_at
    WHERE h.fence = p_fence AND h.end_kind IS NULL;
END
$$;
