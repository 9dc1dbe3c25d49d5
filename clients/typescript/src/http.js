// One request to the lease server, and the bounded retries of an outage: what Client and
// Lease share.

import { setTimeout as sleep } from "node:timers/promises";

import { UnavailableError } from "./errors.js";
import { baseUrl, transport } from "./protocol.js";
import { RetryPolicy } from "./timing.js";

/** @typedef {import("./protocol.js").Answer} Answer */

/**
 * @typedef {object} SendOptions
 * @property {number} [waitMs] how long the server may wait before answering (`wait_ms`)
 * @property {number} [timeoutMs] a tighter limit than the client's for this request
 * @property {AbortSignal} [signal] ends the request early (a lease stopping its renewals)
 */

export class Http {
  #base;
  /** @type {Record<string, string>} */
  #headers;
  #timeoutMs;
  #retry;

  /**
   * @param {string} url
   * @param {{ token?: string | undefined, timeoutMs?: number | undefined, retry?: RetryPolicy | undefined }} options
   */
  constructor(url, { token, timeoutMs = 10_000, retry = new RetryPolicy() }) {
    this.#base = baseUrl(url);
    this.#headers = { "content-type": "application/json" };
    if (token !== undefined) this.#headers.authorization = `Bearer ${token}`;
    this.#timeoutMs = timeoutMs;
    this.#retry = retry;
  }

  /**
   * Sends one request and reads the whole answer. Transport failures and timeouts are
   * `UnavailableError`; statuses are left to the caller.
   * @param {string} method
   * @param {string} path
   * @param {Record<string, unknown>} body
   * @param {SendOptions} [options]
   * @returns {Promise<Answer>}
   */
  async send(method, path, body, { waitMs = 0, timeoutMs, signal } = {}) {
    const limit = Math.min(timeoutMs ?? this.#timeoutMs, this.#timeoutMs) + waitMs;
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(new DOMException(`no answer within ${Math.round(limit)} ms`, "TimeoutError")), limit);
    const stop = () => abort.abort(signal?.reason);
    if (signal?.aborted) stop();
    signal?.addEventListener("abort", stop, { once: true });
    try {
      const response = await fetch(this.#base + path, {
        method,
        headers: this.#headers,
        body: JSON.stringify(body),
        signal: abort.signal,
      });
      const text = await response.text();
      return { status: response.status, body: text, retryAfter: response.headers.get("retry-after") };
    } catch (error) {
      throw transport(abort.signal.aborted ? abort.signal.reason : error);
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", stop);
    }
  }

  /**
   * Runs `attempt`, retrying `UnavailableError` under the policy, never past `until`.
   * @template T
   * @param {() => Promise<T>} attempt
   * @param {{ until?: number, extraMs?: number }} [options]
   * @returns {Promise<T>}
   */
  async retrying(attempt, { until, extraMs = 0 } = {}) {
    const retries = this.#retry.start(until ?? null, extraMs);
    for (;;) {
      try {
        return await attempt();
      } catch (error) {
        if (!(error instanceof UnavailableError)) throw error;
        const pause = retries.pauseMs(error.retryAfterMs);
        if (pause === null) throw error;
        await sleep(pause);
      }
    }
  }
}
