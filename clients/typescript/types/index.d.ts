export { Client } from "./client.js";
export { Lease } from "./lease.js";
export { RetryPolicy } from "./timing.js";
export { admit } from "./guard.js";
export { FencelockError, ForbiddenError, InvalidFenceTokenError, LeaseLostError, MalformedFenceTokenError, NotAcquiredError, ProtocolError, QuotaExceededError, RejectedError, StaleFenceError, UnavailableError } from "./errors.js";
