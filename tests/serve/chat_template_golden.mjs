// The reference side of the chat-template golden test: @huggingface/jinja (the Jinja
// implementation transformers.js uses for apply_chat_template) renders chat templates.
//
//   node chat_template_golden.mjs NODE_MODULES templates NAME...
//       prints {"NAME": source, ...}: the GGUF chat templates of @huggingface/ollama-utils
//       (src/chat-template-automap.ts, the templates of real models as their GGUF files carry
//       them, e.g. "library/mistral:7b-instruct-fp16");
//   node chat_template_golden.mjs NODE_MODULES render CASES
//       CASES is a JSON file [{"template": source, "context": {variables}}, ...]; prints one
//       JSON line per case: {"text": rendered} or {"error": message}.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, mode, ...rest] = process.argv.slice(2);

if (mode === "templates") {
  // The mapping is TypeScript source: one exported array literal of plain objects.
  let src = readFileSync(
    join(nodeModules, "@huggingface/ollama-utils/src/chat-template-automap.ts"), "utf8");
  src = src.replace(/^import type .*$/m, "")
    .replace(/export const OLLAMA_CHAT_TEMPLATE_MAPPING\s*:\s*[A-Za-z]+\[\]\s*=/, "return ");
  const mapping = new Function(src)();
  const out = {};
  for (const name of rest) {
    const entry = mapping.find((e) => e.model === name);
    if (!entry) {
      console.error(`no template named ${name} in @huggingface/ollama-utils`);
      process.exit(2);
    }
    out[name] = entry.gguf;
  }
  process.stdout.write(JSON.stringify(out) + "\n");
} else if (mode === "render") {
  const { Template } = await import(
    pathToFileURL(join(nodeModules, "@huggingface/jinja/dist/index.js")).href);
  const cases = JSON.parse(readFileSync(rest[0], "utf8"));
  const lines = [];
  for (const c of cases) {
    try {
      lines.push(JSON.stringify({ text: new Template(c.template).render(c.context) }));
    } catch (e) {
      lines.push(JSON.stringify({ error: String(e.message ?? e) }));
    }
  }
  process.stdout.write(lines.join("\n") + "\n");
} else {
  console.error("usage: node chat_template_golden.mjs NODE_MODULES templates NAME... | render CASES");
  process.exit(2);
}
