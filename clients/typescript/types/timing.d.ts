/** The largest safety margin: loss is signalled at most this long before expiry. */
export const MAX_SAFETY_MARGIN_MS: 1000;
/** The first pause after a failed renewal; it doubles, up to half the renewal interval. */
export const FIRST_RETRY_MS: 100;
export function now(): number;
/** The timing of one confirmed grant (acquisition or renewal). */
export class Term {
    /**
     * @param {number} sent when the granting request was sent
     * @param {number} expiresInMs the lease's time left, as the server answered
     */
    constructor(sent: number, expiresInMs: number);
    /** Past it the lease counts as lost: its expiry less the margin. @readonly */
    readonly safeUntil: number;
    /** A third of the granted time after sending, leaving two more chances. @readonly */
    readonly renewAt: number;
    /** A third of the granted time; also the longest one renewal may take. @readonly */
    readonly interval: number;
    /**
     * When to try again after `failures` failed renewals in a row (at least 1): a pause from
     * `FIRST_RETRY_MS`, doubling up to half the interval, jittered so that the workers of a
     * restarted server do not all come back at once; not before the server's `Retry-After`.
     * The caller never waits past `safeUntil`.
     * @param {number} failures
     * @param {number} at now
     * @param {number | null} retryAfterMs
     */
    retryAt(failures: number, at: number, retryAfterMs: number | null): number;
    /**
     * How long one renewal may take: an interval, and never past the safe deadline.
     * @param {number} at now
     */
    attemptTimeoutMs(at: number): number;
}
/**
 * How acquire, renew and release retry an outage (`UnavailableError`: a transport error, a
 * timeout, `5xx`, `408`, `429`). The `n`-th pause (from 0) is random between zero and
 * `min(maxBackoffMs, initialBackoffMs * 2 ** n)` ("full jitter"), and at least the server's
 * `Retry-After`. No attempt starts after `deadlineMs` from the first one; one that would
 * have to, to honour `Retry-After`, is not made. A lease's own calls also stop at its safe
 * deadline.
 */
export class RetryPolicy {
    /**
     * @param {{ initialBackoffMs?: number, maxBackoffMs?: number, deadlineMs?: number }} [options]
     *   by default 100 ms, doubling to 1 s, for 5 s
     */
    constructor({ initialBackoffMs, maxBackoffMs, deadlineMs }?: {
        initialBackoffMs?: number;
        maxBackoffMs?: number;
        deadlineMs?: number;
    });
    /** @readonly */ readonly initialBackoffMs: number;
    /** @readonly */ readonly maxBackoffMs: number;
    /** @readonly */ readonly deadlineMs: number;
    /**
     * The largest pause number `attempt` (from 0) may take (at least 1 ms, so that a zero
     * backoff is never a busy loop).
     * @param {number} attempt
     */
    ceilingMs(attempt: number): number;
    /**
     * The retries of one call starting now, ending `deadlineMs` (+ `extraMs`, the wait of a
     * waited acquire) from now or at `until`, whichever is first.
     * @param {number | null} [until]
     * @param {number} [extraMs]
     * @returns {Retries}
     */
    start(until?: number | null, extraMs?: number): Retries;
}
/** The retry state of one call. */
export class Retries {
    /**
     * @param {RetryPolicy} policy
     * @param {number} until
     */
    constructor(policy: RetryPolicy, until: number);
    /**
     * How long to pause before the next attempt, or `null` to give up now: the time is up,
     * or the server's `Retry-After` reaches past it. A jittered pause is cut short at the
     * end, for one last attempt there.
     * @param {number | null} retryAfterMs
     * @returns {number | null}
     */
    pauseMs(retryAfterMs: number | null): number | null;
    #private;
}
