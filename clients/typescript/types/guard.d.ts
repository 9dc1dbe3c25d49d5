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
export function admit(client: Queryable, key: string, token: string | number): Promise<number>;
/**
 * What `admit` needs of a node-postgres `Client` or `PoolClient`: the connection that runs
 * the writing transaction.
 */
export type Queryable = {
    query(text: string, values: unknown[]): Promise<{
        rows: Array<Record<string, unknown>>;
    }>;
};
