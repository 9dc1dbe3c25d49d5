// When to renew, when a lease must be taken as lost, and how long to retry: the client-side
// rules, the same as the Rust and Python clients'. Every time here is in milliseconds on the
// monotonic clock (`performance.now()`). A lease's time is counted from the instant the
// request that granted it was *sent*: the server cannot have started the lease earlier, so
// a deadline counted from there is never late.

/** The largest safety margin: loss is signalled at most this long before expiry. */
export const MAX_SAFETY_MARGIN_MS = 1000;

/** The first pause after a failed renewal; it doubles, up to half the renewal interval. */
export const FIRST_RETRY_MS = 100;

/** Now, on the monotonic clock, in milliseconds. */
export const now = () => performance.now();

/** The timing of one confirmed grant (acquisition or renewal). */
export class Term {
  /**
   * @param {number} sent when the granting request was sent
   * @param {number} expiresInMs the lease's time left, as the server answered
   */
  constructor(sent, expiresInMs) {
    const granted = Math.max(expiresInMs, 0);
    const margin = Math.min(granted / 10, MAX_SAFETY_MARGIN_MS);
    /** Past it the lease counts as lost: its expiry less the margin. @readonly */
    this.safeUntil = sent + granted - margin;
    /** A third of the granted time after sending, leaving two more chances. @readonly */
    this.renewAt = sent + granted / 3;
    /** A third of the granted time; also the longest one renewal may take. @readonly */
    this.interval = granted / 3;
  }

  /**
   * When to try again after `failures` failed renewals in a row (at least 1): a pause from
   * `FIRST_RETRY_MS`, doubling up to half the interval, jittered so that the workers of a
   * restarted server do not all come back at once; not before the server's `Retry-After`.
   * The caller never waits past `safeUntil`.
   * @param {number} failures
   * @param {number} at now
   * @param {number | null} retryAfterMs
   */
  retryAt(failures, at, retryAfterMs) {
    const cap = Math.max(this.interval / 2, FIRST_RETRY_MS);
    const ceiling = Math.min(FIRST_RETRY_MS * 2 ** Math.min(failures - 1, 30), cap);
    const pause = ceiling / 2 + Math.random() * (ceiling / 2);
    return at + Math.max(pause, retryAfterMs ?? 0);
  }

  /**
   * How long one renewal may take: an interval, and never past the safe deadline.
   * @param {number} at now
   */
  attemptTimeoutMs(at) {
    return Math.max(Math.min(Math.max(this.interval, FIRST_RETRY_MS), this.safeUntil - at), 1);
  }
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
  constructor({ initialBackoffMs = 100, maxBackoffMs = 1000, deadlineMs = 5000 } = {}) {
    /** @readonly */ this.initialBackoffMs = initialBackoffMs;
    /** @readonly */ this.maxBackoffMs = maxBackoffMs;
    /** @readonly */ this.deadlineMs = deadlineMs;
  }

  /**
   * The largest pause number `attempt` (from 0) may take (at least 1 ms, so that a zero
   * backoff is never a busy loop).
   * @param {number} attempt
   */
  ceilingMs(attempt) {
    const initial = Math.max(this.initialBackoffMs, 1);
    return Math.min(initial * 2 ** Math.min(attempt, 30), Math.max(this.maxBackoffMs, initial));
  }

  /**
   * The retries of one call starting now, ending `deadlineMs` (+ `extraMs`, the wait of a
   * waited acquire) from now or at `until`, whichever is first.
   * @param {number | null} [until]
   * @param {number} [extraMs]
   * @returns {Retries}
   */
  start(until = null, extraMs = 0) {
    const end = now() + this.deadlineMs + extraMs;
    return new Retries(this, until === null ? end : Math.min(end, until));
  }
}

/** The retry state of one call. */
export class Retries {
  #policy;
  #until;
  #done = 0;

  /**
   * @param {RetryPolicy} policy
   * @param {number} until
   */
  constructor(policy, until) {
    this.#policy = policy;
    this.#until = until;
  }

  /**
   * How long to pause before the next attempt, or `null` to give up now: the time is up,
   * or the server's `Retry-After` reaches past it. A jittered pause is cut short at the
   * end, for one last attempt there.
   * @param {number | null} retryAfterMs
   * @returns {number | null}
   */
  pauseMs(retryAfterMs) {
    const left = this.#until - now();
    if (left <= 0 || (retryAfterMs ?? 0) > left) {
      return null;
    }
    const jittered = Math.random() * this.#policy.ceilingMs(this.#done);
    this.#done += 1;
    return Math.max(Math.min(jittered, left), retryAfterMs ?? 0);
  }
}
