// The paused-worker story end to end: the live lease server, and the SQL guard installed by
// `fencelock guard install` into a fresh PostgreSQL database, called through `admit` over
// node-postgres.

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import pg from "pg";

import { Client, InvalidFenceTokenError, MalformedFenceTokenError, StaleFenceError, admit } from "fencelock";

import { Scratch, installGuard } from "./server.js";

const UPSERT = `INSERT INTO reports VALUES ($1, $2, $3)
                ON CONFLICT (id) DO UPDATE SET body = excluded.body, fence = excluded.fence`;

/**
 * A fresh database with the guard (`fencelock guard install`, as an operator runs it) and
 * the protected table; a connection to it, closed with the test.
 * @param {Scratch} space
 * @param {string[]} fenceKeys
 */
async function guarded(space, fenceKeys = []) {
  const url = await space.database();
  await installGuard(url, fenceKeys);
  return space.connect(url);
}

/**
 * A protected write: the guard's admission and the write in one transaction.
 * @param {pg.Client} db
 * @param {string} key
 * @param {string} token
 * @param {string} body
 */
async function save(db, key, token, body) {
  await db.query("BEGIN");
  try {
    const fence = await admit(db, key, token);
    await db.query(UPSERT, [key, body, fence]);
    await db.query("COMMIT");
    return fence;
  } catch (error) {
    await db.query("ROLLBACK");
    throw error;
  }
}

/**
 * @param {pg.Client} db
 * @param {string} key
 */
async function stored(db, key) {
  const { rows } = await db.query("SELECT body, fence::float8 AS fence FROM reports WHERE id = $1", [key]);
  return rows[0] ?? null;
}

/** @param {import("node:test").TestContext} t */
function scratch(t) {
  const space = new Scratch();
  t.after(() => space.close());
  return space;
}

test("a paused worker's late write is refused", async (t) => {
  const space = scratch(t);
  const server = await space.server();
  const db = await guarded(space);
  const client = new Client(server.url);
  const a = await client.acquire("report:7", { ttlSeconds: 2 });
  assert.ok(a);
  assert.equal(await save(db, "report:7", a.fenceToken, "first draft by A"), a.fence);
  // A pauses past its lease. B waits for the resource and gets it at A's expiry.
  const b = await client.acquire("report:7", { ttlSeconds: 30, waitMs: 10_000 });
  assert.ok(b && b.fence > a.fence);
  assert.ok(a.signal.aborted, "A's lease was signalled lost before B had it");
  assert.equal(await save(db, "report:7", b.fenceToken, "final by B"), b.fence);
  // A wakes up and writes: the guard refuses, naming B's fence; nothing is written.
  await assert.rejects(
    save(db, "report:7", a.fenceToken, "late by A"),
    (error) => error instanceof StaleFenceError && error.current === b.fence && error.key === "report:7",
  );
  assert.deepEqual(await stored(db, "report:7"), { body: "final by B", fence: b.fence });
  // B writes again with the same fence: one holder writes many times.
  assert.equal(await save(db, "report:7", b.fenceToken, "final by B, revised"), b.fence);
});

test("signed fences are checked by the guard", async (t) => {
  const space = scratch(t);
  const key = join(space.dir, "fence.key");
  writeFileSync(key, Buffer.from(Array.from({ length: 32 }, (_, i) => i)));
  const server = await space.server(["--fence-key", key]);
  const db = await guarded(space, [key]);
  const client = new Client(server.url);
  await client.withLease("report:1", { ttlSeconds: 30 }, async (lease) => {
    const other = await client.lease("report:2", { ttlSeconds: 30 });
    assert.equal(await save(db, "report:1", lease.fenceToken, "signed"), lease.fence);
    for (const forged of [String(lease.fence), other.fenceToken, `${lease.fence}.${"A".repeat(43)}`]) {
      await assert.rejects(save(db, "report:1", forged, "forged"), InvalidFenceTokenError);
    }
    await other.release();
    assert.deepEqual(await stored(db, "report:1"), { body: "signed", fence: lease.fence });
  });
});

test("a guard without keys refuses what is not a token", async (t) => {
  const db = await guarded(scratch(t));
  for (const token of ["not-a-fence", "-3", ""]) {
    await assert.rejects(save(db, "report:1", token, "never written"), MalformedFenceTokenError);
  }
  assert.equal(await stored(db, "report:1"), null);
});
