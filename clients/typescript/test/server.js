// The tests run against the real lease server: the `fencelock` binary that FENCELOCK_BIN
// names, or the repository's target/debug/fencelock (`cargo build -p fencelock-server --bin
// fencelock`). Each test starts servers of its own on free ports, on SQLite files in a
// temporary directory or on fresh PostgreSQL databases, and kills them (by their own process)
// at its end. A missing binary or an unreachable PostgreSQL fails the tests.

import { execFileSync, spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import pg from "pg";

const REPOSITORY = fileURLToPath(new URL("../../..", import.meta.url));
const START_TIMEOUT_MS = 60_000;
const ADMIN_URL = process.env.FENCELOCK_TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";

/** The server binary; a missing one fails the test, saying how to build it. */
export function binary() {
  const path = process.env.FENCELOCK_BIN || join(REPOSITORY, "target/debug/fencelock");
  if (!existsSync(path)) {
    throw new Error(`no lease server binary at ${path}: build it with \`cargo build -p fencelock-server --bin fencelock\`, or set FENCELOCK_BIN`);
  }
  return path;
}

/** One `fencelock` process on a free port of 127.0.0.1. */
export class LeaseServer {
  /** @type {string} */ url = "";
  /** @type {string[]} */ log = [];
  #child;

  /** @param {import("node:child_process").ChildProcessWithoutNullStreams} child */
  constructor(child) {
    this.#child = child;
  }

  /**
   * Starts a server with `args` after `--bind 127.0.0.1:0`; resolves once it serves, with
   * its address from the log line that says so.
   * @param {string[]} args
   * @param {string} cwd
   */
  static async start(args, cwd) {
    // Only the flags configure it, whatever this process's environment holds.
    const env = Object.fromEntries(
      Object.entries(process.env).filter(([k]) => !k.startsWith("FENCELOCK_") && k !== "DATABASE_URL" && k !== "RUST_LOG"),
    );
    const child = spawn(binary(), ["--bind", "127.0.0.1:0", "--log-format", "json", ...args], { cwd, env });
    const server = new LeaseServer(child);
    // Read the log to the end, so the pipe never fills.
    const lines = createInterface({ input: child.stderr });
    const address = new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`the lease server did not start; its log:\n${server.log.join("\n")}`)), START_TIMEOUT_MS);
      lines.on("line", (line) => {
        server.log.push(line);
        try {
          const entry = JSON.parse(line);
          if (entry.message === "fencelock serving") {
            clearTimeout(timer);
            resolve(entry.address);
          }
        } catch {
          // not a JSON line
        }
      });
      child.on("exit", () => {
        clearTimeout(timer);
        reject(new Error(`the lease server exited; its log:\n${server.log.join("\n")}`));
      });
    });
    try {
      server.url = `http://${await address}`;
    } catch (error) {
      await server.kill();
      throw error;
    }
    return server;
  }

  /** SIGKILL: the process ends at once, answering nothing more. */
  async kill() {
    if (this.#child.exitCode !== null || this.#child.signalCode !== null) return;
    const exited = new Promise((resolve) => this.#child.once("exit", resolve));
    this.#child.kill("SIGKILL");
    await exited;
  }

  /**
   * The live lease as anyone sees it, `null` when there is none.
   * @param {string} resource
   * @returns {Promise<Record<string, unknown> | null>}
   */
  async inspect(resource) {
    const answer = await fetch(`${this.url}/locks/${resource}`);
    if (answer.status === 404) return null;
    if (answer.status !== 200) throw new Error(`inspect answered ${answer.status}`);
    return /** @type {Record<string, unknown>} */ (await answer.json());
  }
}

/**
 * What one test starts: servers, databases and a scratch directory, all ended by `close()`.
 * `await using` is not Node 20 syntax, so tests call `close()` in `t.after`.
 */
export class Scratch {
  dir = mkdtempSync(join(tmpdir(), "fencelock-client-ts-"));
  /** @type {LeaseServer[]} */ #servers = [];
  /** @type {string[]} */ #databases = [];
  /** @type {pg.Client[]} */ #connections = [];

  /**
   * A lease server on a SQLite file of its own (or on `databaseUrl`), with more `flags`.
   * @param {string[]} [flags]
   * @param {string} [databaseUrl]
   */
  async server(flags = [], databaseUrl = undefined) {
    const url = databaseUrl ?? `sqlite://${join(this.dir, `leases-${this.#servers.length}.db`)}`;
    const server = await LeaseServer.start(["--database-url", url, ...flags], this.dir);
    this.#servers.push(server);
    return server;
  }

  /** A fresh PostgreSQL database, dropped by `close()`: its URL. */
  async database() {
    const name = `fencelock_client_ts_${randomBytes(6).toString("hex")}`;
    await admin((client) => client.query(`CREATE DATABASE "${name}"`));
    this.#databases.push(name);
    const url = new URL(ADMIN_URL);
    url.pathname = `/${name}`;
    return url.toString();
  }

  /**
   * A connection to `databaseUrl`, closed by `close()` before its database is dropped.
   * @param {string} databaseUrl
   */
  async connect(databaseUrl) {
    const client = new pg.Client({ connectionString: databaseUrl });
    await client.connect();
    this.#connections.push(client);
    return client;
  }

  /**
   * Writes an auth file of the given tokens with fresh secrets: its path and the secrets.
   * @param {Array<{ name: string, prefixes: string[], permissions: string[], max_leases?: number }>} entries
   */
  tokens(entries) {
    const secrets = entries.map(() => randomBytes(32).toString("base64url"));
    const blocks = entries.map((entry, i) => {
      const lines = [
        "[[tokens]]",
        `name = ${JSON.stringify(entry.name)}`,
        `sha256 = "${createHash("sha256").update(secrets[i] ?? "").digest("hex")}"`,
        `prefixes = ${JSON.stringify(entry.prefixes)}`,
        `permissions = ${JSON.stringify(entry.permissions)}`,
      ];
      if (entry.max_leases !== undefined) lines.push(`max_leases = ${entry.max_leases}`);
      return lines.join("\n");
    });
    const path = join(this.dir, "auth.toml");
    writeFileSync(path, `${blocks.join("\n\n")}\n`);
    return { path, secrets };
  }

  async close() {
    await Promise.all(this.#connections.map((client) => client.end()));
    await Promise.all(this.#servers.map((server) => server.kill()));
    for (const name of this.#databases) {
      await admin((client) => client.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`));
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * Opens or shuts a database to new connections, ending the open ones when shutting it: a
 * store outage, as the lease server sees one.
 * @param {string} databaseUrl
 * @param {boolean} allowed
 */
export async function setConnections(databaseUrl, allowed) {
  const name = new URL(databaseUrl).pathname.slice(1);
  await admin(async (client) => {
    await client.query(`ALTER DATABASE "${name}" ALLOW_CONNECTIONS ${allowed}`);
    if (!allowed) await client.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", [name]);
  });
}

/**
 * `fencelock guard install` into `databaseUrl`, as an operator runs it; then the protected
 * table of the tests and of the story in docs/client.md.
 * @param {string} databaseUrl
 * @param {string[]} [fenceKeys]
 */
export async function installGuard(databaseUrl, fenceKeys = []) {
  const keys = fenceKeys.flatMap((key) => ["--fence-key", key]);
  execFileSync(binary(), ["guard", "install", "--database-url", databaseUrl, ...keys], { stdio: "pipe" });
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    await client.query("CREATE TABLE reports (id text PRIMARY KEY, body text NOT NULL, fence bigint NOT NULL)");
  } finally {
    await client.end();
  }
}

/**
 * Makes the lease on `resource` expire a second ago by the PostgreSQL store's own clock,
 * without waiting for it (the way the server's own tests age a lease).
 * @param {string} databaseUrl
 * @param {string} resource
 */
export async function expireInStore(databaseUrl, resource) {
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    const aged = await client.query("UPDATE leases SET expires_at = now() - interval '1 second' WHERE resource = $1 AND ended_at IS NULL", [resource]);
    if (aged.rowCount !== 1) throw new Error(`no lease on ${resource} to expire`);
  } finally {
    await client.end();
  }
}

/**
 * Runs `work` on a connection to the administration database.
 * @template T
 * @param {(client: pg.Client) => Promise<T>} work
 */
export async function admin(work) {
  const client = new pg.Client({ connectionString: ADMIN_URL });
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end();
  }
}

/** A port nothing listens on. */
export async function closedPort() {
  const { createServer } = await import("node:net");
  const probe = createServer();
  await new Promise((resolve) => probe.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = probe.address();
  await new Promise((resolve) => probe.close(resolve));
  if (address === null || typeof address === "string") throw new Error("no port");
  return address.port;
}
