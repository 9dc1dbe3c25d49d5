// Client for the fencelock lease server: leases with fencing tokens, renewed in the
// background, a loss signalled through `lease.signal`, and the SQL guard one call away
// (`admit`). See docs/client.md.

export { Client } from "./client.js";
export { Lease } from "./lease.js";
export { RetryPolicy } from "./timing.js";
export { admit } from "./guard.js";
export {
  FencelockError,
  ForbiddenError,
  InvalidFenceTokenError,
  LeaseLostError,
  MalformedFenceTokenError,
  NotAcquiredError,
  ProtocolError,
  QuotaExceededError,
  RejectedError,
  StaleFenceError,
  UnavailableError,
} from "./errors.js";
