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
    constructor(http: Http, resource: string, owner: string, ttlSeconds: number, grant: Grant, sent: number, renewing: boolean, holdsProcess?: boolean);
    /** The locked resource. @readonly @type {string} */ readonly resource: string;
    /** The fencing token of this lease (renewals keep it). @readonly @type {number} */ readonly fence: number;
    /**
     * What to send as `Fencing-Token`: the signed token when the server signs fences
     * (`--fence-key`), else the fence as text.
     * @readonly @type {string}
     */
    readonly fenceToken: string;
    /** Aborted, with a `LeaseLostError`, once the lease is lost or released. @readonly @type {AbortSignal} */
    readonly signal: AbortSignal;
    /** Milliseconds the lease is known to stay held without another renewal (0 once lost). */
    get remainingMs(): number;
    /**
     * Throws `LeaseLostError` unless the lease is still held: not lost, and its safe deadline
     * not passed (checked on the clock, so it is right even before a timer has run). Call it
     * before each protected step.
     */
    check(): void;
    /**
     * Extends the lease by its TTL from now, retrying an outage until its safe deadline.
     * `LeaseLostError` if the server refused (the lease is then lost), `UnavailableError` if
     * it could not be asked in time.
     */
    renew(): Promise<void>;
    /**
     * Stops the renewals and gives the lease back, naming its fence (so that it can never
     * free a newer lease); outages are retried until its safe deadline. Releasing twice is a
     * no-op. `LeaseLostError` if it was lost already; `UnavailableError` if the server could
     * not be asked (the lease then lapses at the end of its TTL).
     */
    release(): Promise<void>;
    /** Releases the lease; never throws (a loss was told through `signal` already). */
    [Symbol.asyncDispose](): Promise<void>;
    #private;
}
export type Http = import("./http.js").Http;
export type Grant = import("./protocol.js").Grant;
