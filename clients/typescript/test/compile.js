// TypeScript as a user of the package writes it: type-checked (strict) against the
// package's declarations, then compiled for Node 20, which cannot parse TypeScript (nor
// `await using`) itself.

import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import ts from "typescript";

export const PACKAGE = fileURLToPath(new URL("..", import.meta.url));

/**
 * Runs this package's `tsc` with `args`; a type error fails with tsc's report.
 * @param {string[]} args
 */
export function tsc(args) {
  try {
    execFileSync(process.execPath, [join(PACKAGE, "node_modules/typescript/bin/tsc"), ...args], { cwd: PACKAGE, encoding: "utf8" });
  } catch (error) {
    const output = /** @type {{ stdout?: string }} */ (error).stdout ?? "";
    throw new Error(`tsc ${args.join(" ")}:\n${output}`);
  }
}

/**
 * Type-checks `source`, compiles it to an ES module and returns the module's path; `edit`
 * changes the compiled code (the test's own addresses). The files live inside the package
 * for the test, so that `fencelock` names this package and `pg` its dev dependency.
 * @param {import("node:test").TestContext} t
 * @param {string} source
 * @param {(code: string) => string} [edit]
 */
export function compile(t, source, edit = (code) => code) {
  const dir = mkdtempSync(join(PACKAGE, ".doc-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const file = join(dir, "module.ts");
  writeFileSync(file, source);
  tsc(["--noEmit", "--strict", "--skipLibCheck", "--target", "es2022", "--lib", "es2022,esnext.disposable", "--module", "nodenext", "--types", "node", file]);
  const options = { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 };
  const compiled = join(dir, "module.mjs");
  writeFileSync(compiled, edit(ts.transpileModule(source, { compilerOptions: options }).outputText));
  return compiled;
}
