// The reference side of the tokenizer.json golden test and benchmark: tokenizers.js
// (@huggingface/tokenizers, the official pure-JavaScript implementation) encodes texts.
//
//   node hf_tokenizer_golden.mjs NODE_MODULES TOKENIZER_DIR INPUT [REPEAT]
//   node hf_tokenizer_golden.mjs NODE_MODULES TOKENIZER_DIR INPUT decode
//
// INPUT holds one text per line, base64-encoded bytes (decoded as UTF-8 the way every
// JavaScript string is made: invalid bytes become U+FFFD). Prints one JSON line per text:
// {"ids": encode without special tokens, "ids_special": encode with them, "decoded": decode of
// ids skipping special tokens}, then {"seconds": [wall, one per pass], "cpu_seconds": [...],
// "bytes": N}. With REPEAT > 0
// it prints only the timings: encoding every text (without special tokens) REPEAT times, each
// pass timed alone. With "decode", INPUT holds one JSON array of ids per line and it prints
// {"decoded": decode of them skipping special tokens} per line.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, dir, input, repeatArg] = process.argv.slice(2);
const { Tokenizer } = await import(
  pathToFileURL(join(nodeModules, "@huggingface/tokenizers/dist/tokenizers.mjs")).href);
const tokenizer = new Tokenizer(
  JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")),
  JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")));

if (repeatArg === "decode") {
  const lines = readFileSync(input, "utf8").split("\n").filter((l) => l.length > 0);
  process.stdout.write(lines.map((l) => JSON.stringify({
    decoded: tokenizer.decode(JSON.parse(l), {
      skip_special_tokens: true, clean_up_tokenization_spaces: false }),
  })).join("\n") + "\n");
  process.exit(0);
}

const texts = readFileSync(input, "utf8").split("\n").filter((l, i, a) => i < a.length - 1 || l)
  .map((line) => Buffer.from(line, "base64").toString("utf8"));
const repeat = Number(repeatArg ?? 0);

const out = [];
if (repeat === 0) {
  for (const text of texts) {
    const ids = tokenizer.encode(text, { add_special_tokens: false }).ids;
    out.push(JSON.stringify({
      ids,
      ids_special: tokenizer.encode(text).ids,
      decoded: ids.length ? tokenizer.decode(ids, {
        skip_special_tokens: true, clean_up_tokenization_spaces: false }) : "",
    }));
  }
}
const seconds = [], cpu_seconds = [];
let bytes = 0;
for (const text of texts) bytes += Buffer.byteLength(text, "utf8");
for (let pass = 0; pass < repeat; ++pass) {
  const start = process.hrtime.bigint(), cpu = process.cpuUsage();
  for (const text of texts) tokenizer.encode(text, { add_special_tokens: false });
  seconds.push(Number(process.hrtime.bigint() - start) / 1e9);
  const used = process.cpuUsage(cpu);
  cpu_seconds.push((used.user + used.system) / 1e6);
}
out.push(JSON.stringify({ seconds, cpu_seconds, bytes }));
process.stdout.write(out.join("\n") + "\n");
