// The answer mapping and the timing rules, as pure functions (no server needed).

import assert from "node:assert/strict";
import { test } from "node:test";

import * as fencelock from "../src/index.js";

import { failure, lockPath, readAcquire, readRelease, readRenew, retryAfterMs } from "../src/protocol.js";
import { Term, now } from "../src/timing.js";

const LOCK = { resource: "job:1", owner: "a", fence: 7, acquired_at: "x", expires_at: "y", expires_in_ms: 60000 };

/**
 * @param {number} status
 * @param {unknown} [body]
 * @param {string | null} [retryAfter]
 */
function answer(status, body = undefined, retryAfter = null) {
  return { status, body: body === undefined ? "" : typeof body === "string" ? body : JSON.stringify(body), retryAfter };
}

/**
 * @param {string} type
 * @param {number} status
 */
function problem(type, status) {
  return { type, title: "t", status, detail: "d", instance: "/x" };
}

/**
 * The error `run` throws.
 * @param {() => unknown} run
 */
function thrown(run) {
  try {
    run();
  } catch (error) {
    return error;
  }
  return assert.fail("nothing thrown");
}

test("acquire tells the lease from contention", () => {
  assert.deepEqual(readAcquire(answer(200, { acquired: true, lock: LOCK }), "job:1"), {
    fence: 7,
    fenceToken: "7",
    expiresInMs: 60000,
    waitedMs: 0,
  });
  const held = readAcquire(answer(200, { acquired: false, resource: "job:1" }), "job:1");
  assert.ok(held instanceof fencelock.NotAcquiredError && held.delayedUntil === null);
  const waited = readAcquire(answer(200, { acquired: true, lock: LOCK, waited_ms: 1200 }), "job:1");
  assert.equal(!(waited instanceof fencelock.NotAcquiredError) && waited.waitedMs, 1200);
  const signed = readAcquire(answer(200, { acquired: true, lock: { ...LOCK, fence_token: "7.sig" } }), "job:1");
  assert.equal(!(signed instanceof fencelock.NotAcquiredError) && signed.fenceToken, "7.sig");
});

test("outages are unavailable, with Retry-After", () => {
  for (const status of [500, 502, 503, 504, 408, 429]) {
    const error = failure(answer(status, problem("store-unavailable", status), "1"));
    assert.ok(error instanceof fencelock.UnavailableError && error.retryAfterMs === 1000, String(status));
  }
});

test("refusals are sorted by remedy", () => {
  assert.ok(failure(answer(429, problem("quota-exceeded", 429))) instanceof fencelock.QuotaExceededError);
  assert.ok(failure(answer(401, problem("unauthorized", 401))) instanceof fencelock.ForbiddenError);
  assert.ok(failure(answer(403, problem("forbidden-scope", 403))) instanceof fencelock.ForbiddenError);
  const invalid = failure(answer(422, problem("validation-failed", 422)));
  assert.ok(invalid instanceof fencelock.RejectedError && !(invalid instanceof fencelock.ForbiddenError) && invalid.status === 422);
  assert.ok(failure(answer(302)) instanceof fencelock.ProtocolError);
  assert.ok(thrown(() => readAcquire(answer(200, "<html>proxy</html>"), "r")) instanceof fencelock.ProtocolError);
  assert.ok(thrown(() => readAcquire(answer(200, { acquired: true }), "r")) instanceof fencelock.ProtocolError);
});

test("renew refusals are lease lost", () => {
  for (const [status, type] of [
    [404, "not-found"],
    [409, "lease-expired"],
    [409, "owner-mismatch"],
    [409, "stale-fence"],
    [409, "something-new"],
  ]) {
    const error = thrown(() => readRenew(answer(Number(status), problem(String(type), Number(status))), "job:1", 7));
    assert.ok(error instanceof fencelock.LeaseLostError && error.reason === type, String(type));
  }
});

test("a renewal answered with another fence breaks the contract", () => {
  assert.equal(readRenew(answer(200, { lock: LOCK }), "job:1", 7).fence, 7);
  assert.ok(thrown(() => readRenew(answer(200, { lock: LOCK }), "job:1", 8)) instanceof fencelock.ProtocolError);
});

test("release refusals", () => {
  readRelease(answer(204), "job:1");
  const taken = thrown(() => readRelease(answer(403, problem("forbidden", 403)), "job:1"));
  assert.ok(taken instanceof fencelock.LeaseLostError && taken.reason === "owner-mismatch");
  assert.ok(thrown(() => readRelease(answer(403, problem("forbidden-scope", 403)), "job:1")) instanceof fencelock.ForbiddenError);
});

test("names go into the path as one segment", () => {
  assert.equal(lockPath("job:42@a+b=c~d.e_f-g"), "/locks/job:42@a+b=c~d.e_f-g");
  assert.equal(lockPath("a/b c!", "/renew"), "/locks/a%2Fb%20c%21/renew");
  assert.equal(lockPath("ü%"), "/locks/%C3%BC%25");
  for (const dots of [".", ".."]) assert.throws(() => lockPath(dots), TypeError);
});

test("Retry-After is read in seconds and as a date", () => {
  assert.equal(retryAfterMs("3"), 3000);
  assert.equal(retryAfterMs(null), null);
  assert.equal(retryAfterMs("Wed, 21 Oct 2015 07:28:00 GMT"), 0);
  assert.equal(retryAfterMs("soon"), null);
});

test("a term renews at a third and keeps a margin", () => {
  const term = new Term(100_000, 3000);
  assert.deepEqual([term.renewAt, term.safeUntil, term.interval], [101_000, 102_700, 1000]);
  assert.equal(new Term(100_000, 60_000).safeUntil, 159_000, "the margin is at most 1 s");
  assert.equal(new Term(100_000, -5).safeUntil, 100_000);
  for (let failures = 1; failures < 40; failures += 1) {
    // Backoff doubles up to half the interval, and honours Retry-After.
    assert.ok(term.retryAt(failures, 0, null) <= 500);
  }
  assert.equal(term.retryAt(1, 0, 1000), 1000);
});

test("retries stop at the deadline, and before a Retry-After past it", () => {
  const policy = new fencelock.RetryPolicy({ initialBackoffMs: 100, maxBackoffMs: 1000, deadlineMs: 10_000 });
  assert.deepEqual([0, 1, 2, 3, 4, 5].map((n) => policy.ceilingMs(n)), [100, 200, 400, 800, 1000, 1000]);
  assert.equal(new fencelock.RetryPolicy({ initialBackoffMs: 0, maxBackoffMs: 0 }).ceilingMs(0), 1);
  const retries = policy.start();
  for (let i = 0; i < 50; i += 1) {
    const pause = retries.pauseMs(null);
    assert.ok(pause !== null && pause <= 1000);
  }
  assert.equal(retries.pauseMs(11_000), null, "Retry-After reaches past the deadline");
  assert.equal(policy.start(now() - 1).pauseMs(null), null);
});
