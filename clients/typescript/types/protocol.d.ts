/**
 * `url` checked (absolute `http`/`https`, no query or fragment) and without a trailing
 * slash: a bad one is a `TypeError` at once, not an `UnavailableError` at the first call.
 * @param {string} url
 */
export function baseUrl(url: string): string;
/**
 * `/locks/{resource}{suffix}`, the resource as one path segment. The characters the
 * contract allows in names go as they are, anything else percent-encoded (so the server
 * sees the name as given, and answers 422 for a bad one, rather than another path).
 * @param {string} resource
 * @param {string} [suffix]
 */
export function lockPath(resource: string, suffix?: string): string;
/** A fresh owner secret: 128 random bits, known only to this process. */
export function newOwner(): string;
/**
 * @param {string} owner
 * @param {number} ttlSeconds
 * @param {number} waitMs
 * @param {number | undefined} lockDelayMs
 */
export function acquireBody(owner: string, ttlSeconds: number, waitMs: number, lockDelayMs: number | undefined): Record<string, unknown>;
/**
 * `200` with `acquired: true` is the lease; `acquired: false` is contention.
 * @param {Answer} answer
 * @param {string} resource
 * @returns {Grant | NotAcquiredError}
 */
export function readAcquire(answer: Answer, resource: string): Grant | NotAcquiredError;
/**
 * `200` is the extended lease (with the fence sent); `404` and every `409`: lost.
 * @param {Answer} answer
 * @param {string} resource
 * @param {number} fence
 */
export function readRenew(answer: Answer, resource: string, fence: number): Grant;
/**
 * `204` is done; `404`, `403 forbidden` and `409`: the caller did not hold that lease
 * (`403 forbidden-scope` is the bearer token's scope: `ForbiddenError`).
 * @param {Answer} answer
 * @param {string} resource
 */
export function readRelease(answer: Answer, resource: string): void;
/**
 * Every answer an operation has no meaning of its own for. Outages (`5xx`, `408`, a `429`
 * other than the token's quota) are `UnavailableError`; a token refused is
 * `ForbiddenError`, its quota `QuotaExceededError`; any other `4xx` is `RejectedError`;
 * the rest `ProtocolError`.
 * @param {Answer} answer
 */
export function failure(answer: Answer): UnavailableError | RejectedError | ProtocolError;
/**
 * A failure to send or to read an answer: connection refused or reset, a timeout.
 * @param {unknown} error
 */
export function transport(error: unknown): UnavailableError;
/**
 * `Retry-After` in milliseconds (delay-seconds or an HTTP date), `null` without one.
 * @param {string | null} value
 */
export function retryAfterMs(value: string | null): number | null;
export type Problem = import("./errors.js").Problem;
/**
 * One HTTP answer, as read off the wire.
 */
export type Answer = {
    status: number;
    body: string;
    retryAfter: string | null;
};
/**
 * A lease as acquire or renew confirmed it to its holder.
 */
export type Grant = {
    fence: number;
    /**
     * the signed token when the server signs fences, else the
     * fence as text
     */
    fenceToken: string;
    expiresInMs: number;
    /**
     * how long the server waited before granting it
     */
    waitedMs: number;
};
import { NotAcquiredError } from "./errors.js";
import { UnavailableError } from "./errors.js";
import { RejectedError } from "./errors.js";
import { ProtocolError } from "./errors.js";
