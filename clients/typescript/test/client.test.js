// Client and Lease against the live lease server.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHmac } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import {
  Client,
  ForbiddenError,
  LeaseLostError,
  NotAcquiredError,
  QuotaExceededError,
  RejectedError,
  RetryPolicy,
  UnavailableError,
} from "fencelock";

import { Scratch, closedPort, expireInStore, setConnections } from "./server.js";

/**
 * A scratch space ended with the test.
 * @param {import("node:test").TestContext} t
 */
function scratch(t) {
  const space = new Scratch();
  t.after(() => space.close());
  return space;
}

/**
 * A server of the test's own on a fresh PostgreSQL database, which the test may break.
 * @param {import("node:test").TestContext} t
 */
async function onDatabase(t) {
  const space = scratch(t);
  const database = await space.database();
  return { database, server: await space.server([], database) };
}

/**
 * Resolves with the reason once `signal` is aborted, or with `null` after `ms`.
 * @param {AbortSignal} signal
 * @param {number} ms
 * @returns {Promise<unknown>}
 */
function aborted(signal, ms) {
  if (signal.aborted) return Promise.resolve(signal.reason);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(null), ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve(signal.reason);
    });
  });
}

/**
 * Polls `condition` until it holds; fails after `ms`.
 * @param {() => boolean} condition
 * @param {number} ms
 */
async function until(condition, ms) {
  const end = performance.now() + ms;
  while (!condition()) {
    assert.ok(performance.now() < end, "not within the time allowed");
    await sleep(20);
  }
}

/**
 * Runs `source` as an ES module in a Node process of its own, `fencelock` naming this
 * package, with `args`: its stdout lines one by one, and its exit. The test kills it at
 * its end if it still runs.
 * @param {import("node:test").TestContext} t
 * @param {Scratch} space
 * @param {string} source
 * @param {string[]} args
 */
function node(t, space, source, args) {
  const script = join(space.dir, `child-${Math.random().toString(36).slice(2)}.mjs`);
  const index = new URL("../src/index.js", import.meta.url).href;
  writeFileSync(script, source.replaceAll('from "fencelock"', `from ${JSON.stringify(index)}`));
  const child = spawn(process.execPath, [script, ...args], { stdio: ["ignore", "pipe", "pipe"] });
  /** @type {string[]} */
  const stderr = [];
  child.stderr.setEncoding("utf8").on("data", (chunk) => stderr.push(chunk));
  /** @type {Promise<{ code: number | null, signal: string | null, stderr: string }>} */
  const exited = new Promise((resolve) => {
    child.on("close", (code, signal) => resolve({ code, signal, stderr: stderr.join("") }));
  });
  t.after(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  });
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  /** The next line of its stdout, parsed as JSON; fails once it has exited without one. */
  async function line() {
    const next = await lines.next();
    if (next.done) assert.fail(`exited without a line: ${JSON.stringify(await exited)}`);
    return JSON.parse(next.value);
  }
  return { line, exited };
}

test("acquire gives a fence, and a held resource gives null", async (t) => {
  const server = await scratch(t).server();
  const client = new Client(server.url);
  const first = await client.acquire("job:1", { ttlSeconds: 30 });
  assert.ok(first);
  assert.equal(first.resource, "job:1");
  assert.ok(first.fence >= 1);
  assert.equal(first.fenceToken, String(first.fence));
  assert.equal(await client.acquire("job:1", { ttlSeconds: 30 }), null);
  const other = await client.acquire("job:2", { ttlSeconds: 30 });
  assert.ok(other && other.fence > first.fence);
  const live = await server.inspect("job:1");
  assert.equal(live?.fence, first.fence);
  assert.ok(!("owner" in (live ?? {})), "the owner is never shown");
  assert.ok(!first.signal.aborted);
  first.check();
});

test("a waiting acquire gets the lease when the holder's expires", async (t) => {
  const server = await scratch(t).server();
  const client = new Client(server.url);
  const sent = performance.now();
  const holder = await client.acquire("job:wait", { ttlSeconds: 1 });
  assert.ok(holder);
  const waiter = await client.acquire("job:wait", { ttlSeconds: 30, waitMs: 10_000 });
  // The server hands over at the holder's expiry, at least the TTL after it was asked.
  assert.ok(waiter && waiter.fence > holder.fence);
  assert.ok(performance.now() - sent >= 1000);
});

test("a wait that runs out is null, or NotAcquiredError for a renewed lease", async (t) => {
  const server = await scratch(t).server();
  const client = new Client(server.url);
  assert.ok(await client.acquire("job:busy", { ttlSeconds: 30 }));
  const started = performance.now();
  assert.equal(await client.acquire("job:busy", { ttlSeconds: 30, waitMs: 300 }), null);
  assert.ok(performance.now() - started >= 300);
  await assert.rejects(
    client.withLease("job:busy", { ttlSeconds: 30 }, async () => assert.fail("ran without the lease")),
    (error) => error instanceof NotAcquiredError && error.resource === "job:busy",
  );
});

test("a lock delay keeps others out after expiry", async (t) => {
  const server = await scratch(t).server();
  const client = new Client(server.url);
  assert.ok(await client.acquire("job:delay", { ttlSeconds: 1, lockDelayMs: 60_000 }));
  await assert.rejects(
    client.lease("job:delay", { ttlSeconds: 30, waitMs: 2000 }),
    (error) => error instanceof NotAcquiredError && typeof error.delayedUntil === "string",
  );
});

test("renew extends the lease and keeps its fence", async (t) => {
  const server = await scratch(t).server();
  const client = new Client(server.url);
  const lease = await client.acquire("job:renew", { ttlSeconds: 1 });
  assert.ok(lease);
  const before = await server.inspect("job:renew");
  await sleep(300); // some work: the renewal is sent after it
  await lease.renew();
  const after = await server.inspect("job:renew");
  assert.equal(after?.fence, lease.fence);
  const extendedMs = Date.parse(String(after?.expires_at)) - Date.parse(String(before?.expires_at));
  assert.ok(extendedMs >= 300, `renewed only ${extendedMs} ms later`);
  assert.ok(lease.remainingMs > 500);
});

test("a lease not renewed is lost before another owner can have it", async (t) => {
  const server = await scratch(t).server();
  const client = new Client(server.url);
  const lease = await client.acquire("job:taken", { ttlSeconds: 2 });
  assert.ok(lease);
  assert.ok(await client.acquire("job:taken", { ttlSeconds: 30, waitMs: 10_000 }));
  assert.ok(lease.signal.aborted, "the holder was told before the hand-over");
  await assert.rejects(lease.renew(), (error) => error instanceof LeaseLostError && error.reason === "unconfirmed");
});

test("a refused renewal aborts the signal at once", async (t) => {
  const { database, server } = await onDatabase(t);
  const client = new Client(server.url);
  await client.withLease("job:refused", { ttlSeconds: 3 }, async (lease) => {
    // The lease expires in the store (as after a pause): the next renewal, within a
    // second, is refused with 409 lease-expired, long before the local deadline.
    await expireInStore(database, "job:refused");
    const reason = await aborted(lease.signal, 1500);
    assert.ok(reason instanceof LeaseLostError && reason.reason === "lease-expired", String(reason));
    assert.throws(() => lease.check(), LeaseLostError);
  });
});

test("release frees the resource", async (t) => {
  const server = await scratch(t).server();
  const client = new Client(server.url);
  const lease = await client.acquire("job:release", { ttlSeconds: 30 });
  assert.ok(lease);
  await lease.release();
  assert.equal(await server.inspect("job:release"), null);
  assert.ok(lease.signal.aborted);
  await lease.release(); // twice: nothing more to do
  await assert.rejects(lease.renew(), (error) => error instanceof LeaseLostError && error.reason === "released");
  const again = await client.acquire("job:release", { ttlSeconds: 30 });
  assert.ok(again && again.fence > lease.fence);
});

test("withLease renews past the TTL and releases at the end", async (t) => {
  const server = await scratch(t).server();
  const client = new Client(server.url);
  const result = await client.withLease("job:long", { ttlSeconds: 2 }, async (lease) => {
    // 4.5 s of work under a 2 s lease: renewed every third of the TTL meanwhile.
    assert.equal(await aborted(lease.signal, 4500), null, "lost during the work");
    lease.check();
    assert.equal((await server.inspect("job:long"))?.fence, lease.fence);
    return "done";
  });
  assert.equal(result, "done");
  assert.equal(await server.inspect("job:long"), null, "released at the end");
});

test("withLease keeps the process alive while its work waits on the lease alone", { timeout: 30_000 }, async (t) => {
  // The work awaits only `lease.signal`: no timer or socket of its own keeps Node running,
  // so the lease's renewal must (else Node exits at once, code 13: an unsettled top-level
  // await, with the lease left to lapse unrenewed).
  const space = scratch(t);
  const database = await space.database();
  const server = await space.server([], database);
  const child = node(
    t,
    space,
    `import { Client } from "fencelock";
    const [url, resource] = process.argv.slice(2);
    const result = await new Client(url).withLease(resource, { ttlSeconds: 2 }, async (lease) => {
      console.log(JSON.stringify({ fence: lease.fence }));
      await new Promise((resolve) => lease.signal.addEventListener("abort", resolve));
      return lease.signal.reason.reason;
    });
    console.log(JSON.stringify({ result }));`,
    [server.url, "job:alone"],
  );
  const { fence } = await child.line();
  const first = await server.inspect("job:alone");
  assert.equal(first?.fence, fence);
  // 4.5 s after the line: held then only if a renewal was sent after 2.5 s, past the
  // first 2 s TTL (renewals come every 0.67 s, so the expiry has moved by about 4 s).
  const early = await Promise.race([child.exited, sleep(4500).then(() => null)]);
  assert.equal(early, null, `exited while its work waited: ${JSON.stringify(early)}`);
  const later = await server.inspect("job:alone");
  assert.equal(later?.fence, fence, "the lease was not renewed past its first TTL");
  const renewedMs = Date.parse(String(later?.expires_at)) - Date.parse(String(first?.expires_at));
  assert.ok(renewedMs >= 2000, `its expiry moved only ${renewedMs} ms`);
  // The lease expires in the store: the next renewal is refused, the signal aborts, the
  // work returns, and withLease settles with its result.
  await expireInStore(database, "job:alone");
  assert.deepEqual(await child.line(), { result: "lease-expired" });
  const { code, stderr } = await child.exited;
  assert.equal(code, 0, stderr);
});

test("a lease outside withLease does not keep the process alive", { timeout: 30_000 }, async (t) => {
  // Forgotten leases (never released) do not keep a finished script running for ever; they
  // lapse at the end of their TTL.
  const space = scratch(t);
  const server = await space.server();
  const child = node(
    t,
    space,
    `import { Client } from "fencelock";
    const client = new Client(process.argv[2]);
    const renewed = await client.lease("job:forgotten", { ttlSeconds: 30 });
    const acquired = await client.acquire("job:unrenewed", { ttlSeconds: 30 });
    console.log(JSON.stringify([renewed.fence, acquired?.fence]));`,
    [server.url],
  );
  const fences = await child.line();
  const { code, stderr } = await child.exited;
  assert.equal(code, 0, stderr);
  assert.equal((await server.inspect("job:forgotten"))?.fence, fences[0], "left to lapse, not released");
  assert.equal((await server.inspect("job:unrenewed"))?.fence, fences[1]);
});

test("the signal is aborted within the TTL when the server dies, and nothing rejects", async (t) => {
  const server = await scratch(t).server();
  const client = new Client(server.url);
  /** @type {unknown[]} */
  const unhandled = [];
  const record = (/** @type {unknown} */ reason) => unhandled.push(reason);
  process.on("unhandledRejection", record);
  t.after(() => process.off("unhandledRejection", record));
  const result = await client.withLease("job:doomed", { ttlSeconds: 2 }, async (lease) => {
    assert.equal(await aborted(lease.signal, 800), null, "a first renewal went through");
    await server.kill();
    // The last confirmed renewal was sent before the kill: its safe deadline is at most
    // 1.8 s on, the server's expiry at least 2 s.
    const reason = await aborted(lease.signal, 2000);
    assert.ok(reason instanceof LeaseLostError && reason.reason === "unconfirmed", String(reason));
    return "stopped in time";
  });
  // withLease settles with the work's own result; the release after the loss threw nothing.
  assert.equal(result, "stopped in time");
  await sleep(50);
  assert.deepEqual(unhandled, []);
});

test("Symbol.asyncDispose releases, and never throws after a loss", async (t) => {
  const server = await scratch(t).server();
  const client = new Client(server.url);
  const lease = await client.lease("job:dispose", { ttlSeconds: 30 });
  await lease[Symbol.asyncDispose]();
  assert.equal(await server.inspect("job:dispose"), null);
  const lost = await client.acquire("job:lost", { ttlSeconds: 1 });
  assert.ok(lost);
  await aborted(lost.signal, 2000);
  assert.ok(lost.signal.aborted);
  await lost[Symbol.asyncDispose]();
});

test("a store outage is retried until it ends", async (t) => {
  const { database, server } = await onDatabase(t);
  const client = new Client(server.url);
  await client.withLease("job:outage", { ttlSeconds: 6 }, async (lease) => {
    await setConnections(database, false);
    // The next renewal, at most 2 s away, is answered 503 with Retry-After: 1 and retried.
    await until(() => lease.remainingMs < 3000, 5000);
    await setConnections(database, true);
    await until(() => lease.remainingMs > 4500, 4000);
    assert.ok(!lease.signal.aborted);
  });
});

test("acquire retries 503 honouring Retry-After, then is unavailable", async (t) => {
  const { database, server } = await onDatabase(t);
  await setConnections(database, false);
  const client = new Client(server.url, { retry: new RetryPolicy({ deadlineMs: 2500 }) });
  const started = performance.now();
  await assert.rejects(
    client.acquire("job:503", { ttlSeconds: 30 }),
    (error) => error instanceof UnavailableError && error.retryAfterMs === 1000,
  );
  const elapsed = performance.now() - started;
  // Three attempts a second apart (Retry-After: 1); a fourth would start after 2.5 s.
  assert.ok(elapsed >= 2000 && elapsed < 3500, String(elapsed));
});

test("a dead server is unavailable within the retry deadline", async () => {
  const client = new Client(`http://127.0.0.1:${await closedPort()}`, { retry: new RetryPolicy({ deadlineMs: 1000 }) });
  const started = performance.now();
  await assert.rejects(client.acquire("job:1", { ttlSeconds: 30 }), UnavailableError);
  await assert.rejects(client.withLease("job:1", { ttlSeconds: 30 }, async () => {}), UnavailableError);
  assert.ok(performance.now() - started < 3000);
});

test("bearer tokens", async (t) => {
  const space = scratch(t);
  const { path, secrets } = space.tokens([
    { name: "workers", prefixes: ["job:"], permissions: ["lock", "read"], max_leases: 1 },
    { name: "reader", prefixes: [""], permissions: ["read"] },
  ]);
  const [workers = "", reader = ""] = secrets;
  const server = await space.server(["--auth-file", path]);
  await assert.rejects(
    new Client(server.url).acquire("job:1", { ttlSeconds: 30 }),
    (error) => error instanceof ForbiddenError && error.status === 401 && error.problemType === "unauthorized",
  );
  const client = new Client(server.url, { token: workers });
  const lease = await client.acquire("job:1", { ttlSeconds: 30 });
  assert.ok(lease);
  await assert.rejects(client.acquire("job:2", { ttlSeconds: 30 }), QuotaExceededError);
  await assert.rejects(
    client.acquire("report:1", { ttlSeconds: 30 }),
    (error) => error instanceof ForbiddenError && error.status === 403 && error.problemType === "forbidden-scope",
  );
  await lease.release();
  await assert.rejects(new Client(server.url, { token: reader }).acquire("job:1", { ttlSeconds: 30 }), ForbiddenError);
});

test("signed fences", async (t) => {
  const space = scratch(t);
  const key = join(space.dir, "fence.key");
  writeFileSync(key, Buffer.from(Array.from({ length: 32 }, (_, i) => i)));
  const server = await space.server(["--fence-key", key]);
  const client = new Client(server.url);
  await client.withLease("job:signed", { ttlSeconds: 30 }, async (lease) => {
    const signature = createHmac("sha256", readFileSync(key)).update(`job:signed\n${lease.fence}`).digest("base64url");
    assert.equal(lease.fenceToken, `${lease.fence}.${signature}`);
  });
});

test("bad requests are rejected, not retried", async (t) => {
  const server = await scratch(t).server();
  const client = new Client(server.url);
  await assert.rejects(client.acquire("job:1", { ttlSeconds: 0 }), (error) => error instanceof RejectedError && error.status === 422);
  await assert.rejects(client.acquire("..", { ttlSeconds: 30 }), TypeError);
  assert.throws(() => new Client("localhost:8080"), TypeError);
});

