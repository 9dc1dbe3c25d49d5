// The SQL guard (`fencelock guard install`) called through node-postgres, its refusals
// turned into this package's errors by SQLSTATE.

import { InvalidFenceTokenError, MalformedFenceTokenError, StaleFenceError } from "./errors.js";

/**
 * What `admit` needs of a node-postgres `Client` or `PoolClient`: the connection that runs
 * the writing transaction.
 * @typedef {{ query(text: string, values: unknown[]): Promise<{ rows: Array<Record<string, unknown>> }> }} Queryable
 */

/**
 * Admits `token` (a lease's `fenceToken`) for `key` (the lease's resource) through
 * `fencelock_guard.admit`, inside the caller's transaction, before the protected write:
 * the fence admitted, or `StaleFenceError` (`current`: the newer fence) when a newer lease
 * has written, `InvalidFenceTokenError` for a token not signed for `key`,
 * `MalformedFenceTokenError` for one that is not a token. After a refusal the transaction
 * is aborted: roll it back, having written nothing.
 *
 * The key's guard row stays locked until the transaction ends, so the check and the write
 * are one atomic step. Call it in READ COMMITTED (or retry on `40001`); admit several keys
 * in sorted order.
 * @param {Queryable} client
 * @param {string} key
 * @param {string | number} token
 * @returns {Promise<number>}
 */
export async function admit(client, key, token) {
  let result;
  try {
    result = await client.query("SELECT fencelock_guard.admit($1, $2) AS fence", [key, String(token)]);
  } catch (error) {
    throw refusal(error, key) ?? error;
  }
  return Number(result.rows[0]?.fence);
}

/**
 * The guard's refusal as this package's error, or `null` for any other database error.
 * @param {unknown} error
 * @param {string} key
 */
function refusal(error, key) {
  if (!(error instanceof Error) || !("code" in error)) return null;
  const options = { cause: error };
  switch (error.code) {
    case "FL409": {
      // The guard puts the current fence in DETAIL; its message names it too.
      const detail = "detail" in error && typeof error.detail === "string" ? error.detail : "";
      const digits = /^\d+$/.test(detail) ? detail : /current fence is (\d+)/.exec(error.message)?.[1];
      return new StaleFenceError(key, digits ? Number(digits) : null, error.message, options);
    }
    case "FL403":
      return new InvalidFenceTokenError(error.message, options);
    case "FL400":
      return new MalformedFenceTokenError(error.message, options);
    default:
      return null;
  }
}
