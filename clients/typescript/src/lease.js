// A held lease: its fence, its renewals, and the signal of its loss.

import { FencelockError, LeaseLostError } from "./errors.js";
import { lockPath, readRelease, readRenew } from "./protocol.js";
import { Term, now } from "./timing.js";

/** @typedef {import("./http.js").Http} Http */
/** @typedef {import("./protocol.js").Grant} Grant */

/** The reason of a lease given back by its holder; every other reason is a loss. */
const RELEASED = "released";
/** The reason of a lease whose safe deadline passed without a confirmed renewal. */
const UNCONFIRMED = "unconfirmed";

/**
 * A held lock on one resource, from `Client.acquire` (renewed by `renew()` only) or
 * `Client.lease` / `Client.withLease` (renewed every third of its TTL in the background).
 *
 * - `fenceToken` is what to send as `Fencing-Token` with every protected write.
 * - `signal` is aborted as soon as the lease can no longer be trusted: a renewal was
 *   refused, or its safe deadline (the expiry of the last confirmed grant, counted from
 *   when that request was sent, less a tenth of the TTL, at most 1 s) came without a
 *   confirmed renewal; also once it is released. Its `reason` is a `LeaseLostError`. A
 *   loss never rejects a promise of its own: nothing goes unhandled.
 * - `await using lease = await client.lease(...)` releases it at the end of the scope,
 *   never throwing for a loss (`[Symbol.asyncDispose]`).
 * - Inside `Client.withLease` its timers keep the process alive until it is released or
 *   lost, so that work awaiting nothing but `signal` goes on; every other lease's timers
 *   are unreferenced, so that a lease never released does not keep a process that has
 *   nothing else to do running (and renewed) for ever: it lapses at the end of its TTL.
 */
export class Lease {
  /** The locked resource. @readonly @type {string} */ resource;
  /** The fencing token of this lease (renewals keep it). @readonly @type {number} */ fence;
  /**
   * What to send as `Fencing-Token`: the signed token when the server signs fences
   * (`--fence-key`), else the fence as text.
   * @readonly @type {string}
   */
  fenceToken;
  /** Aborted, with a `LeaseLostError`, once the lease is lost or released. @readonly @type {AbortSignal} */
  signal;

  #http;
  #owner;
  #ttlSeconds;
  #term;
  /** @type {{ reason: string, detail: string } | null} */
  #loss = null;
  #lastError = "no renewal was confirmed in time";
  #lost = new AbortController();
  /** Ends the renewals and any request of theirs in flight. */
  #stop = new AbortController();
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  #deadline;
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  #renewal;
  /** @type {Promise<void>} */
  #inFlight = Promise.resolve();
  #failures = 0;
  /** Whether its timers keep the process alive (inside `withLease`). */
  #holdsProcess;

  /**
   * Made by `Client`, not by hand.
   * @param {Http} http
   * @param {string} resource
   * @param {string} owner
   * @param {number} ttlSeconds
   * @param {Grant} grant
   * @param {number} sent
   * @param {boolean} renewing
   * @param {boolean} [holdsProcess] whether its timers keep the process alive
   */
  constructor(http, resource, owner, ttlSeconds, grant, sent, renewing, holdsProcess = false) {
    this.resource = resource;
    this.fence = grant.fence;
    this.fenceToken = grant.fenceToken;
    this.signal = this.#lost.signal;
    this.#http = http;
    this.#owner = owner;
    this.#ttlSeconds = ttlSeconds;
    this.#holdsProcess = holdsProcess;
    // The server granted the lease only after waiting `waitedMs`, which began after the
    // request was sent: counting from there is later, and still never late.
    this.#term = new Term(sent + grant.waitedMs, grant.expiresInMs);
    this.#armDeadline();
    if (renewing) this.#scheduleRenewal(this.#term.renewAt);
  }

  /** Milliseconds the lease is known to stay held without another renewal (0 once lost). */
  get remainingMs() {
    return this.#loss ? 0 : Math.max(this.#term.safeUntil - now(), 0);
  }

  /**
   * Throws `LeaseLostError` unless the lease is still held: not lost, and its safe deadline
   * not passed (checked on the clock, so it is right even before a timer has run). Call it
   * before each protected step.
   */
  check() {
    const loss = this.#lossNow();
    if (loss) {
      this.#lose(loss.reason, loss.detail);
      throw new LeaseLostError(this.resource, loss.reason, loss.detail);
    }
  }

  /**
   * Extends the lease by its TTL from now, retrying an outage until its safe deadline.
   * `LeaseLostError` if the server refused (the lease is then lost), `UnavailableError` if
   * it could not be asked in time.
   */
  async renew() {
    this.check();
    const until = this.#term.safeUntil;
    await this.#http.retrying(() => this.#renewOnce(until - now()), { until });
  }

  /**
   * Stops the renewals and gives the lease back, naming its fence (so that it can never
   * free a newer lease); outages are retried until its safe deadline. Releasing twice is a
   * no-op. `LeaseLostError` if it was lost already; `UnavailableError` if the server could
   * not be asked (the lease then lapses at the end of its TTL).
   */
  async release() {
    await this.#stopRenewing();
    const known = this.#lossNow();
    if (known?.reason === RELEASED) return;
    if (known) {
      this.#lose(known.reason, known.detail);
      throw new LeaseLostError(this.resource, known.reason, known.detail);
    }
    const path = lockPath(this.resource);
    let attempts = 0;
    try {
      await this.#http.retrying(
        async () => {
          attempts += 1;
          const answer = await this.#http.send("DELETE", path, { owner: this.#owner, fence: this.fence });
          try {
            readRelease(answer, this.resource);
          } catch (error) {
            // A 404 after an attempt whose answer was lost: that attempt released it.
            const released = attempts > 1 && error instanceof LeaseLostError && error.reason === "not-found";
            if (!released) throw error;
          }
        },
        { until: this.#term.safeUntil },
      );
    } catch (error) {
      if (error instanceof LeaseLostError) this.#lose(error.reason, "");
      throw error;
    } finally {
      this.#lose(RELEASED, "");
    }
  }

  /** Releases the lease; never throws (a loss was told through `signal` already). */
  async [Symbol.asyncDispose]() {
    try {
      await this.release();
    } catch (error) {
      if (!(error instanceof FencelockError)) throw error;
      // LeaseLostError: nothing to give back. Otherwise it lapses at the end of its TTL.
    }
  }

  /**
   * One renewal request, its answer recorded.
   * @param {number} timeoutMs
   */
  async #renewOnce(timeoutMs) {
    const sent = now();
    const body = { owner: this.#owner, ttl_seconds: this.#ttlSeconds, fence: this.fence };
    const answer = await this.#http.send("POST", lockPath(this.resource, "/renew"), body, {
      timeoutMs,
      signal: this.#stop.signal,
    });
    let renewed;
    try {
      renewed = readRenew(answer, this.resource, this.fence);
    } catch (error) {
      if (error instanceof LeaseLostError) this.#lose(error.reason, error.message);
      throw error;
    }
    // A loss is final, whatever answers arrive after it. Of two renewals, the later
    // deadline counts: the server extends from when each arrives.
    const term = new Term(sent, renewed.expiresInMs);
    if (this.#loss === null && term.safeUntil > this.#term.safeUntil) {
      this.#term = term;
      this.#armDeadline();
    }
  }

  /**
   * The background renewal: a timer at `at`, then one attempt; a failure is retried with
   * backoff until the safe deadline. Never rejects: every end is a loss or a stop.
   * @param {number} at
   */
  #scheduleRenewal(at) {
    if (this.#loss || this.#stop.signal.aborted) return;
    this.#renewal = setTimeout(() => {
      if (this.#loseIfDue() || this.#stop.signal.aborted) return;
      const term = this.#term;
      this.#inFlight = this.#renewOnce(term.attemptTimeoutMs(now())).then(
        () => {
          this.#failures = 0;
          this.#scheduleRenewal(this.#term.renewAt);
        },
        (error) => {
          if (this.#loss || this.#stop.signal.aborted || error instanceof LeaseLostError) return;
          this.#failures += 1;
          this.#lastError = error instanceof Error ? error.message : String(error);
          const retryAfterMs = error instanceof FencelockError && "retryAfterMs" in error ? error.retryAfterMs : null;
          this.#scheduleRenewal(term.retryAt(this.#failures, now(), /** @type {number | null} */ (retryAfterMs)));
        },
      ).catch((bug) => this.#lose(UNCONFIRMED, `the renewal failed: ${bug}`));
    }, Math.max(Math.min(at, this.#term.safeUntil) - now(), 0));
    this.#keepAliveOrNot(this.#renewal);
  }

  async #stopRenewing() {
    this.#stop.abort();
    clearTimeout(this.#renewal);
    await this.#inFlight;
  }

  /** (Re)starts the timer that aborts `signal` at the safe deadline, independent of any request in flight. */
  #armDeadline() {
    clearTimeout(this.#deadline);
    if (this.#loss) return;
    this.#deadline = setTimeout(() => {
      if (!this.#loseIfDue()) this.#armDeadline();
    }, Math.max(this.#term.safeUntil - now(), 0));
    this.#keepAliveOrNot(this.#deadline);
  }

  /**
   * Unreferences `timer` unless the lease holds the process. Inside `withLease` the deadline
   * timer, armed from the grant until the loss or release, keeps the process alive through
   * renewals and their retries; both timers are cleared at the loss, so work that ignores
   * the loss keeps nothing alive through the lease. Outside it, a lease alone never keeps
   * the process alive.
   * @param {ReturnType<typeof setTimeout>} timer
   */
  #keepAliveOrNot(timer) {
    if (!this.#holdsProcess) timer.unref();
  }

  #lossNow() {
    if (this.#loss === null && now() >= this.#term.safeUntil) {
      return { reason: UNCONFIRMED, detail: this.#lastError };
    }
    return this.#loss;
  }

  #loseIfDue() {
    const loss = this.#lossNow();
    if (loss) this.#lose(loss.reason, loss.detail);
    return loss !== null;
  }

  /**
   * Marks the lease lost (or released) once, and aborts `signal`.
   * @param {string} reason
   * @param {string} detail
   */
  #lose(reason, detail) {
    if (this.#loss) return;
    this.#loss = { reason, detail };
    clearTimeout(this.#deadline);
    clearTimeout(this.#renewal);
    this.#stop.abort();
    this.#lost.abort(new LeaseLostError(this.resource, reason, detail));
  }
}
