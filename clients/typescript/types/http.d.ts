/** @typedef {import("./protocol.js").Answer} Answer */
/**
 * @typedef {object} SendOptions
 * @property {number} [waitMs] how long the server may wait before answering (`wait_ms`)
 * @property {number} [timeoutMs] a tighter limit than the client's for this request
 * @property {AbortSignal} [signal] ends the request early (a lease stopping its renewals)
 */
export class Http {
    /**
     * @param {string} url
     * @param {{ token?: string | undefined, timeoutMs?: number | undefined, retry?: RetryPolicy | undefined }} options
     */
    constructor(url: string, { token, timeoutMs, retry }: {
        token?: string | undefined;
        timeoutMs?: number | undefined;
        retry?: RetryPolicy | undefined;
    });
    /**
     * Sends one request and reads the whole answer. Transport failures and timeouts are
     * `UnavailableError`; statuses are left to the caller.
     * @param {string} method
     * @param {string} path
     * @param {Record<string, unknown>} body
     * @param {SendOptions} [options]
     * @returns {Promise<Answer>}
     */
    send(method: string, path: string, body: Record<string, unknown>, { waitMs, timeoutMs, signal }?: SendOptions): Promise<Answer>;
    /**
     * Runs `attempt`, retrying `UnavailableError` under the policy, never past `until`.
     * @template T
     * @param {() => Promise<T>} attempt
     * @param {{ until?: number, extraMs?: number }} [options]
     * @returns {Promise<T>}
     */
    retrying<T>(attempt: () => Promise<T>, { until, extraMs }?: {
        until?: number;
        extraMs?: number;
    }): Promise<T>;
    #private;
}
export type Answer = import("./protocol.js").Answer;
export type SendOptions = {
    /**
     * how long the server may wait before answering (`wait_ms`)
     */
    waitMs?: number;
    /**
     * a tighter limit than the client's for this request
     */
    timeoutMs?: number;
    /**
     * ends the request early (a lease stopping its renewals)
     */
    signal?: AbortSignal;
};
import { RetryPolicy } from "./timing.js";
