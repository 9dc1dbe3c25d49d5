// What can go wrong, sorted by what the caller should do about it (the same classes as the
// Python client's `fencelock.errors`):
// - NotAcquiredError: someone else holds the lock (for the whole wait). Try again later.
// - UnavailableError: the server could not be reached or could not answer, even after the
//   bounded retries. The outcome is unknown.
// - LeaseLostError: the lease is no longer held. Stop the protected work.
// - StaleFenceError, InvalidFenceTokenError, MalformedFenceTokenError: the SQL guard
//   refused a write.
// - RejectedError (with ForbiddenError and QuotaExceededError): the server refused the
//   request as it stands; sending it again will not help.
// - ProtocolError: an answer outside the HTTP contract (not a fencelock server?).

/** @typedef {Record<string, unknown>} Problem An RFC 9457 problem document. */

/** The base of every error this package throws. */
export class FencelockError extends Error {
  /**
   * @param {string} message
   * @param {ErrorOptions} [options]
   */
  constructor(message, options) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** Another owner holds `resource` (through the whole `waitMs`, when one was given). */
export class NotAcquiredError extends FencelockError {
  /**
   * @param {string} resource
   * @param {string | null} [delayedUntil] RFC 3339, when the resource is free but in its
   *   lock delay
   */
  constructor(resource, delayedUntil = null) {
    const detail = delayedUntil ? ` (lock delay until ${delayedUntil})` : "";
    super(`${JSON.stringify(resource)} is held by another owner${detail}`);
    /** @readonly */ this.resource = resource;
    /** @readonly */ this.delayedUntil = delayedUntil;
  }
}

/**
 * The lease on `resource` is no longer held: stop the work it protects. `reason` is the
 * server's problem type when it refused (`"not-found"`, `"lease-expired"`,
 * `"owner-mismatch"`, `"stale-fence"`, ...), `"unconfirmed"` when no renewal was confirmed
 * before the lease's safe deadline, or `"released"` after its holder released it.
 */
export class LeaseLostError extends FencelockError {
  /**
   * @param {string} resource
   * @param {string} reason
   * @param {string} [detail]
   */
  constructor(resource, reason, detail = "") {
    super(`the lease on ${JSON.stringify(resource)} is lost: ${reason}${detail ? `: ${detail}` : ""}`);
    /** @readonly */ this.resource = resource;
    /** @readonly */ this.reason = reason;
  }
}

/**
 * The server was unreachable, timed out, or answered `5xx`, `408` or `429` after the
 * bounded retries. An acquire that ends like this may have succeeded unseen; its lease then
 * lapses at the end of its TTL. `retryAfterMs` is the server's `Retry-After`, if it sent one.
 */
export class UnavailableError extends FencelockError {
  /**
   * @param {string} message
   * @param {number | null} [retryAfterMs]
   * @param {ErrorOptions} [options]
   */
  constructor(message, retryAfterMs = null, options = undefined) {
    super(message, options);
    /** @readonly */ this.retryAfterMs = retryAfterMs;
  }
}

/**
 * The guard refused a write whose fence is lower than one it has admitted for `key`: a
 * newer lease exists. `current` is that newer fence (when the guard named it).
 */
export class StaleFenceError extends FencelockError {
  /**
   * @param {string} key
   * @param {number | null} current
   * @param {string} [message]
   * @param {ErrorOptions} [options]
   */
  constructor(key, current, message = "", options = undefined) {
    super(message || `stale fence for ${JSON.stringify(key)}; the current fence is ${current}`, options);
    /** @readonly */ this.key = key;
    /** @readonly */ this.current = current;
  }
}

/**
 * The guard refused a token not signed by one of its keys for this key (a forged token, a
 * token of another resource, or a bare fence where signed ones are required).
 */
export class InvalidFenceTokenError extends FencelockError {}

/** The guard was given something that is not a fence token at all. */
export class MalformedFenceTokenError extends FencelockError {}

/**
 * The server refused the request as it stands (a `4xx`): a bug in the request or the
 * set-up, not a passing condition. `problem` is the server's problem document.
 */
export class RejectedError extends FencelockError {
  /**
   * @param {number} status
   * @param {Problem} problem
   */
  constructor(status, problem) {
    const type = typeof problem.type === "string" ? problem.type : "";
    const detail = typeof problem.detail === "string" ? problem.detail : "";
    super(`${status} ${type}${detail ? `: ${detail}` : ""}`);
    /** @readonly */ this.status = status;
    /** @readonly */ this.problem = problem;
    /** @readonly */ this.problemType = type;
  }
}

/**
 * The bearer token is missing or unknown (`401 unauthorized`), or does not cover this
 * resource or operation (`403 forbidden-scope`).
 */
export class ForbiddenError extends RejectedError {}

/**
 * The bearer token holds its `max_leases` already (`429 quota-exceeded`): release one
 * first; waiting alone does not help.
 */
export class QuotaExceededError extends RejectedError {}

/** An answer that breaks the HTTP contract. */
export class ProtocolError extends FencelockError {}
