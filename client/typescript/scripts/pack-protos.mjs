// `npm pack` / `npm publish` hooks: `copy` (prepack) puts the repository's proto/sessionlog into
// this package's proto/, which package.json's "files" ships; `clean` (postpack) removes it again.
// The copy exists only while a tarball is made, so it can never go stale in a checkout, where
// lib/index.js falls back to the repository's proto/. The google/protobuf imports need no copy:
// protobufjs (a dependency) bundles the well-known types and proto-loader resolves them there.

import { cpSync, existsSync, rmSync, statSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const SOURCE = resolve(PACKAGE, "..", "..", "proto", "sessionlog");
const COPY = resolve(PACKAGE, "proto");

const step = process.argv[2];
if (step === "copy") {
  if (!existsSync(SOURCE)) throw new Error(`no ${SOURCE}: npm pack runs from a sessionlog checkout`);
  rmSync(COPY, { recursive: true, force: true });
  const protosOnly = (path) => statSync(path).isDirectory() || path.endsWith(".proto");
  cpSync(SOURCE, resolve(COPY, "sessionlog"), { recursive: true, filter: protosOnly });
} else if (step === "clean") {
  rmSync(COPY, { recursive: true, force: true });
} else {
  throw new Error(`usage: node scripts/pack-protos.mjs copy|clean (got ${step})`);
}
