// `make gen-ts`: writes src/proto.ts, the TypeScript shapes of sessionlog's messages as the client
// sees them at run time, from the repository's proto/ (read with protobufjs, as the client reads
// it). The shapes follow the client's proto-loader options (keepCase, longs: Number, enums:
// String, defaults: true, oneofs: true): field names as in the .proto, 64-bit integers as numbers,
// enums as their value names, unset scalars and lists at their defaults, unset messages null,
// oneof members and proto3 `optional` fields absent unless set, and each oneof's name field
// naming the member that is set. `--check` compares instead of writing (`make gen-check`).

import { readFileSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import protobuf from "protobufjs";

const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const PROTO_DIR = resolve(PACKAGE, "..", "..", "proto");
const OUTPUT = resolve(PACKAGE, "src", "proto.ts");
const FILES = ["sessionlog/v1/session_log_service.proto", "sessionlog/v1/admin_service.proto"];

const SCALARS = {
  double: "number",
  float: "number",
  int32: "number",
  uint32: "number",
  sint32: "number",
  fixed32: "number",
  sfixed32: "number",
  int64: "number",
  uint64: "number",
  sint64: "number",
  fixed64: "number",
  sfixed64: "number",
  bool: "boolean",
  string: "string",
  bytes: "Buffer",
};

function load() {
  const root = new protobuf.Root();
  root.resolvePath = (_origin, target) => {
    // protobufjs bundles google/protobuf/*.proto under those very names.
    return target.startsWith("google/protobuf/") ? target : resolve(PROTO_DIR, target);
  };
  root.loadSync(FILES, { keepCase: true, alternateCommentMode: true });
  root.resolveAll();
  return root;
}

/** Every message and enum of the root, nested ones included, in declaration order. */
function walk(namespace, found = []) {
  for (const nested of namespace.nestedArray) {
    if (nested instanceof protobuf.Type || nested instanceof protobuf.Enum) found.push(nested);
    if (nested instanceof protobuf.Namespace || nested instanceof protobuf.Type) walk(nested, found);
  }
  return found;
}

/** The TypeScript name of a type: its name below its package, dots as underscores. */
function nameOf(type) {
  const parts = [];
  for (let at = type; at && !(at instanceof protobuf.Root); at = at.parent) {
    if (at instanceof protobuf.Type || at instanceof protobuf.Enum) parts.unshift(at.name);
  }
  return parts.join("_");
}

function comment(text, indent) {
  if (!text) return [];
  const lines = text.split("\n").map((line) => line.replace(/\*\//g, "*\\/").trimEnd());
  if (lines.length === 1) return [`${indent}/** ${lines[0]} */`];
  return [`${indent}/**`, ...lines.map((line) => (line ? `${indent} * ${line}` : `${indent} *`)), `${indent} */`];
}

function fieldType(field) {
  const value = field.resolvedType ? nameOf(field.resolvedType) : SCALARS[field.type];
  if (!value) throw new Error(`no TypeScript type for ${field.fullName} (${field.type})`);
  if (field.map) return `{ [key: ${SCALARS[field.keyType]}]: ${value} }`;
  if (field.repeated) return `${value}[]`;
  return value;
}

function messageLines(type) {
  const lines = [...comment(type.comment, ""), `export interface ${nameOf(type)} {`];
  for (const field of type.fieldsArray) {
    lines.push(...comment(field.comment, "  "));
    const type = fieldType(field);
    if (field.partOf) lines.push(`  ${field.name}?: ${type};`);
    else if (field.resolvedType instanceof protobuf.Type && !field.repeated && !field.map) {
      lines.push(`  ${field.name}: ${type} | null;`);
    } else lines.push(`  ${field.name}: ${type};`);
  }
  for (const oneof of type.oneofsArray) {
    const members = oneof.fieldsArray.map((field) => JSON.stringify(field.name)).join(" | ");
    lines.push(`  /** Which of the oneof's fields is set. */`, `  ${oneof.name}?: ${members};`);
  }
  lines.push("}");
  return lines;
}

function enumLines(type) {
  const names = Object.keys(type.values).map((name) => `  | ${JSON.stringify(name)}`);
  return [...comment(type.comment, ""), `export type ${nameOf(type)} =`, ...names.slice(0, -1), `${names.at(-1)};`];
}

function serviceLines(service) {
  const lines = [
    ...comment(service.comment, ""),
    `export interface ${service.name}Methods {`,
  ];
  for (const method of service.methodsArray) {
    const kind = `${method.requestStream ? "stream" : "unary"}-${method.responseStream ? "stream" : "unary"}`;
    lines.push(
      `  ${method.name}: { request: ${nameOf(method.resolvedRequestType)}; response: ${nameOf(method.resolvedResponseType)}; kind: "${kind}" };`,
    );
  }
  lines.push("}");
  return lines;
}

function generate() {
  const root = load();
  const types = walk(root);
  const seen = new Map();
  for (const type of types) {
    const name = nameOf(type);
    if (seen.has(name)) throw new Error(`two types named ${name}: ${seen.get(name)} and ${type.fullName}`);
    seen.set(name, type.fullName);
  }
  const services = root.lookup("sessionlog.v1").nestedArray.filter((nested) => nested instanceof protobuf.Service);
  const blocks = [
    [
      "// Generated by scripts/gen-proto-types.mjs from proto/ (`make gen-ts`); do not edit.",
      "// Messages as the client receives them (proto-loader: keepCase, longs: Number, enums: String,",
      "// defaults: true, oneofs: true); a request may leave any field out (Input<T>).",
      "",
      "/** A request as proto-loader encodes it: every field may be left out (or null). */",
      "export type Input<T> = T extends Buffer",
      "  ? Buffer | Uint8Array",
      "  : T extends (infer U)[]",
      "    ? Input<U>[]",
      "    : T extends object",
      "      ? { [K in keyof T]?: Input<T[K]> | null }",
      "      : T;",
    ],
    ...types.map((type) => (type instanceof protobuf.Type ? messageLines(type) : enumLines(type))),
    ...services.map(serviceLines),
  ];
  return `${blocks.map((block) => block.join("\n")).join("\n\n")}\n`;
}

const text = generate();
if (process.argv[2] === "--check") {
  let current = "";
  try {
    current = readFileSync(OUTPUT, "utf8");
  } catch {
    // missing: stale
  }
  if (current !== text) {
    console.error("stale: client/typescript/src/proto.ts; run make gen");
    process.exit(1);
  }
} else {
  writeFileSync(OUTPUT, text);
}
