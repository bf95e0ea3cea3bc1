// Parse each Mermaid diagram given on stdin (a JSON list of texts) with Mermaid's own parser, as
// the docs site's browser would: `node tests/mermaid_parse.mjs < diagrams.json`. One line per
// diagram, "ok TYPE" or "error MESSAGE"; exit 1 if any failed, 3 if mermaid or jsdom cannot be
// found (resolved from the repository's node_modules, then NODE_PATH).
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const require = createRequire(import.meta.url);
let mermaidPath, jsdomPath;
try {
  mermaidPath = require.resolve("mermaid");
  jsdomPath = require.resolve("jsdom");
} catch (e) {
  console.log(`missing: ${e.message.split("\n")[0]}`);
  process.exit(3);
}
// Mermaid sanitizes labels with DOMPurify, which needs a window: jsdom stands in for the browser.
const { JSDOM } = await import(pathToFileURL(jsdomPath).href);
const dom = new JSDOM("<!doctype html><html><body></body></html>");
globalThis.window = dom.window;
globalThis.document = dom.window.document;
const { default: mermaid } = await import(pathToFileURL(mermaidPath).href);

const texts = JSON.parse(readFileSync(0, "utf8"));
let failed = 0;
for (const text of texts) {
  try {
    const parsed = await mermaid.parse(text);
    console.log(`ok ${parsed.diagramType}`);
  } catch (e) {
    failed += 1;
    console.log(`error ${String(e.message || e).split("\n").join(" | ")}`);
  }
}
process.exit(failed ? 1 : 0);
