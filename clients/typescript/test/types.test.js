// The package ships JavaScript with JSDoc types, and the declarations in types/ made from
// them, so that installing it needs no build step. Both are checked here: the sources and
// tests type-check (`tsc --noEmit`, strict), and types/ is what `npm run types` makes now.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const PACKAGE = fileURLToPath(new URL("..", import.meta.url));
const TSC = join(PACKAGE, "node_modules/typescript/bin/tsc");

/** @param {string[]} args */
function tsc(args) {
  execFileSync(process.execPath, [TSC, ...args], { cwd: PACKAGE, stdio: ["ignore", "pipe", "pipe"] });
}

test("the sources and the tests type-check", () => {
  tsc(["-p", "tsconfig.json"]);
});

test("types/ holds the declarations of the sources as they are", (t) => {
  const out = mkdtempSync(join(tmpdir(), "fencelock-types-"));
  t.after(() => rmSync(out, { recursive: true, force: true }));
  tsc(["-p", "tsconfig.types.json", "--outDir", out]);
  const committed = readdirSync(join(PACKAGE, "types")).sort();
  assert.deepEqual(readdirSync(out).sort(), committed, "run `npm run types` in clients/typescript");
  for (const file of committed) {
    assert.equal(
      readFileSync(join(PACKAGE, "types", file), "utf8"),
      readFileSync(join(out, file), "utf8"),
      `types/${file} is stale: run \`npm run types\` in clients/typescript`,
    );
  }
});
