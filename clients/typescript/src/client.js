// The client of one lease server.

import { Http } from "./http.js";
import { Lease } from "./lease.js";
import { NotAcquiredError } from "./errors.js";
import { acquireBody, lockPath, newOwner, readAcquire } from "./protocol.js";
import { now } from "./timing.js";

/** @typedef {import("./timing.js").RetryPolicy} RetryPolicy */
/** @typedef {import("./protocol.js").Grant} Grant */

/**
 * @typedef {object} ClientOptions
 * @property {string | undefined} [token] the bearer secret, for a server with `--auth-file`
 * @property {number | undefined} [timeoutMs] the limit of one request (plus the wait of an acquire
 *   with `waitMs`); 10 s by default
 * @property {RetryPolicy | undefined} [retry] how long an outage is retried; by default pauses from
 *   100 ms doubling to 1 s, for at most 5 s
 */

/**
 * @typedef {object} AcquireOptions
 * @property {number} ttlSeconds the lease's time to live, in whole seconds
 * @property {number | undefined} [waitMs] how long the server may wait for the holder to let go
 *   (first come, first served); 0 by default: one attempt
 * @property {number | undefined} [lockDelayMs] after this lease ends by expiry, how long nobody else
 *   may acquire the resource
 */

/**
 * A client of one fencelock server (or of a load balancer before several sharing a store).
 */
export class Client {
  #http;

  /**
   * @param {string} url the lease server, e.g. `http://127.0.0.1:8080`
   * @param {ClientOptions} [options]
   */
  constructor(url, { token, timeoutMs, retry } = {}) {
    this.#http = new Http(url, { token, timeoutMs, retry });
  }

  /**
   * Acquires `resource` under a fresh owner secret: the `Lease`, or `null` when another
   * owner holds it (through `waitMs`, when given). The lease is *not* renewed by itself:
   * call `renew()` in time, or use `lease` / `withLease`. Outages are retried under the
   * client's policy with the same owner (a re-acquire), then throw `UnavailableError`.
   * @param {string} resource
   * @param {AcquireOptions} options
   * @returns {Promise<Lease | null>}
   */
  async acquire(resource, options) {
    const granted = await this.#acquire(resource, options);
    return granted instanceof NotAcquiredError ? null : this.#hold(resource, options, granted, false);
  }

  /**
   * Acquires `resource` (throwing `NotAcquiredError` when held) and renews it every third
   * of its TTL until it is released, lost, or disposed of:
   * `await using lease = await client.lease("job:42", { ttlSeconds: 30 })`.
   * @param {string} resource
   * @param {AcquireOptions} options
   * @returns {Promise<Lease>}
   */
  async lease(resource, options) {
    return this.#renewed(resource, options, false);
  }

  /**
   * Runs `work` under a lease on `resource`, renewed in the background, and releases it
   * at the end. Settles with `work`'s own result or error, never with the loss: `work`
   * watches `lease.signal` (and may call `lease.check()`) to stop in time.
   * `NotAcquiredError` if the resource is held (through `waitMs`). While `work` runs and
   * the lease is held, its renewal keeps the process alive, even if `work` awaits nothing
   * but `lease.signal`.
   * @template T
   * @param {string} resource
   * @param {AcquireOptions} options
   * @param {(lease: Lease) => Promise<T>} work
   * @returns {Promise<T>}
   */
  async withLease(resource, options, work) {
    const lease = await this.#renewed(resource, options, true);
    try {
      return await work(lease);
    } finally {
      await lease[Symbol.asyncDispose]();
    }
  }

  /**
   * A lease renewed in the background, or `NotAcquiredError`.
   * @param {string} resource
   * @param {AcquireOptions} options
   * @param {boolean} holdsProcess whether its timers keep the process alive
   */
  async #renewed(resource, options, holdsProcess) {
    const granted = await this.#acquire(resource, options);
    if (granted instanceof NotAcquiredError) throw granted;
    return this.#hold(resource, options, granted, true, holdsProcess);
  }

  /**
   * @param {string} resource
   * @param {AcquireOptions} options
   * @returns {Promise<{ owner: string, grant: Grant, sent: number } | NotAcquiredError>}
   */
  async #acquire(resource, { ttlSeconds, waitMs = 0, lockDelayMs }) {
    const owner = newOwner();
    const path = lockPath(resource);
    const waitUntil = now() + waitMs;
    return this.#http.retrying(
      async () => {
        // A retry after an outage waits only for what is left of the wait.
        const wait = waitMs ? Math.max(Math.round(waitUntil - now()), 0) : 0;
        const sent = now();
        const answer = await this.#http.send("POST", path, acquireBody(owner, ttlSeconds, wait, lockDelayMs), {
          waitMs: wait,
        });
        const grant = readAcquire(answer, resource);
        return grant instanceof NotAcquiredError ? grant : { owner, grant, sent };
      },
      { extraMs: waitMs },
    );
  }

  /**
   * @param {string} resource
   * @param {AcquireOptions} options
   * @param {{ owner: string, grant: Grant, sent: number }} granted
   * @param {boolean} renewing
   * @param {boolean} [holdsProcess]
   */
  #hold(resource, { ttlSeconds }, { owner, grant, sent }, renewing, holdsProcess = false) {
    return new Lease(this.#http, resource, owner, ttlSeconds, grant, sent, renewing, holdsProcess);
  }
}
