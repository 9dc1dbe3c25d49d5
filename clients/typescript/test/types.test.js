// The package ships JavaScript with JSDoc types, and the declarations in types/ made from
// them, so that installing it needs no build step. Both are checked here: the sources and
// tests type-check (`tsc --noEmit`, strict), types/ is what `npm run types` makes now, and
// TypeScript code using them compiles and runs (`await using`, which Node 20 cannot parse).

import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";

import { PACKAGE, compile, tsc } from "./compile.js";
import { Scratch } from "./server.js";

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

test("`await using` holds a lease for the scope and releases it at its end", async (t) => {
  const space = new Scratch();
  t.after(() => space.close());
  const server = await space.server();
  const source = `import { Client } from "fencelock";

    export async function scoped(url: string, inside: (fence: number) => Promise<void>): Promise<number> {
      await using lease = await new Client(url).lease("job:scoped", { ttlSeconds: 30 });
      await inside(lease.fence);
      return lease.fence;
    }`;
  const module = await import(pathToFileURL(compile(t, source)).href);
  const scoped = /** @type {(url: string, inside: (fence: number) => Promise<void>) => Promise<number>} */ (module.scoped);
  const fence = await scoped(server.url, async (held) => {
    assert.equal((await server.inspect("job:scoped"))?.fence, held, "held inside the scope");
  });
  assert.ok(fence >= 1);
  assert.equal(await server.inspect("job:scoped"), null, "released at the end of the scope");
});
