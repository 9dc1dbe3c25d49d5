// The TypeScript story of docs/client.md type-checks against this package's declarations
// and runs as it is shown, against a live lease server and a database with the SQL guard
// (only its two addresses are changed to the test's own).

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { PACKAGE, compile } from "./compile.js";
import { Scratch, installGuard } from "./server.js";

const DOC = join(PACKAGE, "../../docs/client.md");

/**
 * The fenced code blocks of `markdown` whose info string's first word is `lang`.
 * @param {string} markdown
 * @param {string} lang
 */
function blocks(markdown, lang) {
  return [...markdown.matchAll(new RegExp(`^\`\`\`${lang}\\b[^\\n]*\\n([\\s\\S]*?)^\`\`\``, "gm"))].map((m) => m[1] ?? "");
}

test("the paused-worker story type-checks and runs as shown", async (t) => {
  const [story = ""] = blocks(readFileSync(DOC, "utf8"), "ts");
  assert.ok(story.split("\n").length - 1 < 30, "the story is under 30 lines");
  const space = new Scratch();
  t.after(() => space.close());
  const server = await space.server();
  const database = await space.database();
  await installGuard(database);
  const script = compile(t, story, (code) =>
    code.replace("http://127.0.0.1:8080", server.url).replace("postgresql://127.0.0.1/app", database),
  );
  const output = execFileSync(process.execPath, [script], { cwd: PACKAGE, encoding: "utf8", timeout: 60_000 });
  const refused = /^refused: fence (\d+) < (\d+)\n$/.exec(output);
  assert.ok(refused, output);
  const [a, b] = [Number(refused[1]), Number(refused[2])];
  assert.ok(a < b);
  const db = await space.connect(database);
  const { rows } = await db.query("SELECT body, fence::float8 AS fence FROM reports");
  assert.deepEqual(rows, [{ body: "final by B", fence: b }]);
});
