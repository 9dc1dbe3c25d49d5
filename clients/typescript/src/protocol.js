// The HTTP contract in one place: the requests the client sends, and the one mapping of the
// server's answers (status, problem type) to results and errors. Pure functions, unit-tested
// without a server; the same mapping as the Python client's `_protocol.py`.

import {
  ForbiddenError,
  LeaseLostError,
  NotAcquiredError,
  ProtocolError,
  QuotaExceededError,
  RejectedError,
  UnavailableError,
} from "./errors.js";

/** @typedef {import("./errors.js").Problem} Problem */

/**
 * One HTTP answer, as read off the wire.
 * @typedef {{ status: number, body: string, retryAfter: string | null }} Answer
 */

/**
 * A lease as acquire or renew confirmed it to its holder.
 * @typedef {object} Grant
 * @property {number} fence
 * @property {string} fenceToken the signed token when the server signs fences, else the
 *   fence as text
 * @property {number} expiresInMs
 * @property {number} waitedMs how long the server waited before granting it
 */

// The characters the contract allows in a resource name.
const NAME_CHAR = /^[A-Za-z0-9._\-:@+=~]$/;

// Longest slice of a body that is not JSON kept in an error (an HTML page from a proxy).
const MAX_RAW_BODY = 512;

/**
 * `url` checked (absolute `http`/`https`, no query or fragment) and without a trailing
 * slash: a bad one is a `TypeError` at once, not an `UnavailableError` at the first call.
 * @param {string} url
 */
export function baseUrl(url) {
  const parsed = URL.canParse(url) ? new URL(url) : null;
  if (parsed === null || !["http:", "https:"].includes(parsed.protocol)) {
    throw new TypeError(`the lease server URL ${JSON.stringify(url)} is not an absolute http or https URL`);
  }
  if (parsed.search || parsed.hash) {
    throw new TypeError(`the lease server URL ${JSON.stringify(url)} has a query or fragment`);
  }
  return url.replace(/\/+$/, "");
}

/**
 * `/locks/{resource}{suffix}`, the resource as one path segment. The characters the
 * contract allows in names go as they are, anything else percent-encoded (so the server
 * sees the name as given, and answers 422 for a bad one, rather than another path).
 * @param {string} resource
 * @param {string} [suffix]
 */
export function lockPath(resource, suffix = "") {
  if (resource === "." || resource === "..") {
    // Every URL parser folds these away as path steps, acting on another resource.
    throw new TypeError(`the resource ${JSON.stringify(resource)} cannot be named in a URL path`);
  }
  let segment = "";
  for (const byte of new TextEncoder().encode(resource)) {
    const char = String.fromCharCode(byte);
    segment += NAME_CHAR.test(char) ? char : `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return `/locks/${segment}${suffix}`;
}

/** A fresh owner secret: 128 random bits, known only to this process. */
export function newOwner() {
  return Buffer.from(crypto.getRandomValues(new Uint8Array(16))).toString("hex");
}

/**
 * @param {string} owner
 * @param {number} ttlSeconds
 * @param {number} waitMs
 * @param {number | undefined} lockDelayMs
 */
export function acquireBody(owner, ttlSeconds, waitMs, lockDelayMs) {
  /** @type {Record<string, unknown>} */
  const body = { owner, ttl_seconds: ttlSeconds };
  // Absent rather than 0, so that servers without waiting or lock delay serve them too.
  if (waitMs) body.wait_ms = waitMs;
  if (lockDelayMs !== undefined) body.lock_delay_ms = lockDelayMs;
  return body;
}

/**
 * `200` with `acquired: true` is the lease; `acquired: false` is contention.
 * @param {Answer} answer
 * @param {string} resource
 * @returns {Grant | NotAcquiredError}
 */
export function readAcquire(answer, resource) {
  if (answer.status !== 200) throw failure(answer);
  const body = jsonObject(answer);
  if (body.acquired === false) {
    return new NotAcquiredError(resource, typeof body.delayed_until === "string" ? body.delayed_until : null);
  }
  if (body.acquired !== true || !isObject(body.lock)) {
    throw new ProtocolError(`acquire answered without a lock: ${excerpt(answer.body)}`);
  }
  return grant(body.lock, body.waited_ms ?? body.lock.waited_ms ?? 0);
}

/**
 * `200` is the extended lease (with the fence sent); `404` and every `409`: lost.
 * @param {Answer} answer
 * @param {string} resource
 * @param {number} fence
 */
export function readRenew(answer, resource, fence) {
  if (answer.status !== 200) throw loss(answer, resource) ?? failure(answer);
  const lock = jsonObject(answer).lock;
  if (!isObject(lock)) throw new ProtocolError(`renew answered without a lock: ${excerpt(answer.body)}`);
  const renewed = grant(lock, 0);
  if (renewed.fence !== fence) {
    throw new ProtocolError(`renew of fence ${fence} answered with fence ${renewed.fence}`);
  }
  return renewed;
}

/**
 * `204` is done; `404`, `403 forbidden` and `409`: the caller did not hold that lease
 * (`403 forbidden-scope` is the bearer token's scope: `ForbiddenError`).
 * @param {Answer} answer
 * @param {string} resource
 */
export function readRelease(answer, resource) {
  if (answer.status === 204) return;
  if (answer.status === 403 && problem(answer).type === "forbidden") {
    throw new LeaseLostError(resource, "owner-mismatch", "another owner holds the lease");
  }
  throw loss(answer, resource) ?? failure(answer);
}

/**
 * The answers of renew and release that mean the lease is gone: `404`, any `409`.
 * @param {Answer} answer
 * @param {string} resource
 */
function loss(answer, resource) {
  if (answer.status !== 404 && answer.status !== 409) return null;
  const { type, detail } = problem(answer);
  const reason = typeof type === "string" && type ? type : answer.status === 404 ? "not-found" : "conflict";
  return new LeaseLostError(resource, reason, typeof detail === "string" ? detail : "");
}

/**
 * Every answer an operation has no meaning of its own for. Outages (`5xx`, `408`, a `429`
 * other than the token's quota) are `UnavailableError`; a token refused is
 * `ForbiddenError`, its quota `QuotaExceededError`; any other `4xx` is `RejectedError`;
 * the rest `ProtocolError`.
 * @param {Answer} answer
 */
export function failure(answer) {
  const { status } = answer;
  const doc = problem(answer);
  if (status >= 500 || status === 408 || (status === 429 && doc.type !== "quota-exceeded")) {
    return new UnavailableError(`${status} ${doc.type ?? ""}: ${doc.detail ?? ""}`, retryAfterMs(answer.retryAfter));
  }
  if (status === 429) return new QuotaExceededError(status, doc);
  if (status === 401 || (status === 403 && doc.type === "forbidden-scope")) return new ForbiddenError(status, doc);
  if (status >= 400 && status < 500) return new RejectedError(status, doc);
  return new ProtocolError(`unexpected ${status}: ${excerpt(answer.body)}`);
}

/**
 * A failure to send or to read an answer: connection refused or reset, a timeout.
 * @param {unknown} error
 */
export function transport(error) {
  const cause = error instanceof Error && error.cause instanceof Error ? `: ${error.cause.message}` : "";
  const message = error instanceof Error ? `${error.name}: ${error.message}${cause}` : String(error);
  return new UnavailableError(`the lease server could not be reached: ${message}`, null, { cause: error });
}

/**
 * `Retry-After` in milliseconds (delay-seconds or an HTTP date), `null` without one.
 * @param {string | null} value
 */
export function retryAfterMs(value) {
  if (value === null) return null;
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1000;
  const when = Date.parse(trimmed);
  return Number.isNaN(when) ? null : Math.max(when - Date.now(), 0);
}

/**
 * @param {Record<string, unknown>} lock
 * @param {unknown} waitedMs
 * @returns {Grant}
 */
function grant(lock, waitedMs) {
  const { fence, expires_in_ms: expiresInMs, fence_token: token } = lock;
  if (!Number.isSafeInteger(fence) || !Number.isSafeInteger(expiresInMs)) {
    throw new ProtocolError(`a lock without an integer fence and expires_in_ms: ${JSON.stringify(lock)}`);
  }
  return {
    fence: /** @type {number} */ (fence),
    fenceToken: typeof token === "string" ? token : String(fence),
    expiresInMs: /** @type {number} */ (expiresInMs),
    waitedMs: Number.isSafeInteger(waitedMs) && /** @type {number} */ (waitedMs) > 0 ? /** @type {number} */ (waitedMs) : 0,
  };
}

/**
 * @param {unknown} value
 * @returns {value is Record<string, unknown>}
 */
function isObject(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** @param {string} text */
function parse(text) {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** @param {Answer} answer */
function jsonObject(answer) {
  const body = parse(answer.body);
  if (!isObject(body)) throw new ProtocolError(`expected a JSON object, got: ${excerpt(answer.body)}`);
  return body;
}

/**
 * The problem document, or `{ detail: <the raw text> }` when the body is not one.
 * @param {Answer} answer
 * @returns {Problem}
 */
function problem(answer) {
  const body = parse(answer.body);
  return isObject(body) ? body : { detail: excerpt(answer.body) };
}

/** @param {string} body */
function excerpt(body) {
  return body.slice(0, MAX_RAW_BODY);
}
