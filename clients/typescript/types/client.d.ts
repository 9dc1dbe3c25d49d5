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
    /**
     * @param {string} url the lease server, e.g. `http://127.0.0.1:8080`
     * @param {ClientOptions} [options]
     */
    constructor(url: string, { token, timeoutMs, retry }?: ClientOptions);
    /**
     * Acquires `resource` under a fresh owner secret: the `Lease`, or `null` when another
     * owner holds it (through `waitMs`, when given). The lease is *not* renewed by itself:
     * call `renew()` in time, or use `lease` / `withLease`. Outages are retried under the
     * client's policy with the same owner (a re-acquire), then throw `UnavailableError`.
     * @param {string} resource
     * @param {AcquireOptions} options
     * @returns {Promise<Lease | null>}
     */
    acquire(resource: string, options: AcquireOptions): Promise<Lease | null>;
    /**
     * Acquires `resource` (throwing `NotAcquiredError` when held) and renews it every third
     * of its TTL until it is released, lost, or disposed of:
     * `await using lease = await client.lease("job:42", { ttlSeconds: 30 })`.
     * @param {string} resource
     * @param {AcquireOptions} options
     * @returns {Promise<Lease>}
     */
    lease(resource: string, options: AcquireOptions): Promise<Lease>;
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
    withLease<T>(resource: string, options: AcquireOptions, work: (lease: Lease) => Promise<T>): Promise<T>;
    #private;
}
export type RetryPolicy = import("./timing.js").RetryPolicy;
export type Grant = import("./protocol.js").Grant;
export type ClientOptions = {
    /**
     * the bearer secret, for a server with `--auth-file`
     */
    token?: string | undefined;
    /**
     * the limit of one request (plus the wait of an acquire
     * with `waitMs`); 10 s by default
     */
    timeoutMs?: number | undefined;
    /**
     * how long an outage is retried; by default pauses from
     * 100 ms doubling to 1 s, for at most 5 s
     */
    retry?: RetryPolicy | undefined;
};
export type AcquireOptions = {
    /**
     * the lease's time to live, in whole seconds
     */
    ttlSeconds: number;
    /**
     * how long the server may wait for the holder to let go
     * (first come, first served); 0 by default: one attempt
     */
    waitMs?: number | undefined;
    /**
     * after this lease ends by expiry, how long nobody else
     * may acquire the resource
     */
    lockDelayMs?: number | undefined;
};
import { Lease } from "./lease.js";
