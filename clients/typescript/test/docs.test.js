// The TypeScript story of docs/client.md type-checks against this package's declarations
// and runs as it is shown, against a live lease server and a database with the SQL guard
// (only its two addresses are changed to the test's own).

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import ts from "typescript";

import { Scratch, installGuard } from "./server.js";

const PACKAGE = fileURLToPath(new URL("..", import.meta.url));
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
  // Inside the package, so that `fencelock` names this package and `pg` its dev dependency.
  const dir = mkdtempSync(join(PACKAGE, ".doc-"));
  const space = new Scratch();
  t.after(async () => {
    rmSync(dir, { recursive: true, force: true });
    await space.close();
  });
  writeFileSync(join(dir, "story.ts"), story);
  execFileSync(
    process.execPath,
    [join(PACKAGE, "node_modules/typescript/bin/tsc"), "--noEmit", "--strict", "--skipLibCheck", "--target", "es2022", "--module", "nodenext", "--types", "node", join(dir, "story.ts")],
    { cwd: PACKAGE, stdio: "pipe" },
  );

  const server = await space.server();
  const database = await space.database();
  await installGuard(database);
  const script = ts.transpileModule(story, { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 } }).outputText;
  writeFileSync(join(dir, "story.mjs"), script.replace("http://127.0.0.1:8080", server.url).replace("postgresql://127.0.0.1/app", database));
  const output = execFileSync(process.execPath, [join(dir, "story.mjs")], { cwd: PACKAGE, encoding: "utf8", timeout: 60_000 });
  const refused = /^refused: fence (\d+) < (\d+)\n$/.exec(output);
  assert.ok(refused, output);
  const [a, b] = [Number(refused[1]), Number(refused[2])];
  assert.ok(a < b);
  const db = await space.connect(database);
  const { rows } = await db.query("SELECT body, fence::float8 AS fence FROM reports");
  assert.deepEqual(rows, [{ body: "final by B", fence: b }]);
});
