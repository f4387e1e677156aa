// bench_tokenizer.js: encode throughput of the npm reference encoders on the same text as bench_tokenizer.c:
// tiktoken (WASM build of tiktoken's Rust core; gpt2 and cl100k_base) and gpt-tokenizer (pure JS; r50k_base and
// cl100k_base). Text is read as UTF-8 (the timing excludes reading); best of 3 runs.
// Prints "js <package> <encoding> 1 <MB/s> <tokens>" lines for bench_tokenizer.sh.
// usage: node dev/bench/bench_tokenizer.js TEXT
"use strict";
const fs = require("fs");
const path = require("path");
const mods = path.join(__dirname, "..", "data", "node_tools", "node_modules");

function best(fn) {
  let t = Infinity, n = 0;
  for (let r = 0; r < 3; r++) {
    const t0 = process.hrtime.bigint();
    n = fn();
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    if (dt < t) t = dt;
  }
  return [t, n];
}

const file = process.argv[2];
const bytes = fs.statSync(file).size;
const text = fs.readFileSync(file, "utf8");
const { get_encoding } = require(path.join(mods, "tiktoken"));
for (const [name, enc] of [["gpt2", "gpt2"], ["cl100k", "cl100k_base"]]) {
  const e = get_encoding(enc);
  const [t, n] = best(() => e.encode_ordinary(text).length);
  console.log(`js tiktoken ${name} 1 ${(bytes / 1e6 / t).toFixed(2)} ${n}`);
  e.free();
}
for (const [name, mod] of [["gpt2", "r50k_base"], ["cl100k", "cl100k_base"]]) {
  const g = require(path.join(mods, "gpt-tokenizer", "cjs", "encoding", mod + ".js"));
  const [t, n] = best(() => g.encode(text, { disallowedSpecial: new Set() }).length);
  console.log(`js gpt-tokenizer ${name} 1 ${(bytes / 1e6 / t).toFixed(2)} ${n}`);
}
