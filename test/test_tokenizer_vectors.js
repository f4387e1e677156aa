// test_tokenizer_vectors.js: computes reference encodings with the npm `tiktoken` package (the WASM build of
// tiktoken's Rust core) for test/test_tokenizer.c to compare against, for both gpt2 (r50k_base) and cl100k_base.
// Cases: fixed tricky strings (contractions in odd cases, digit runs, every White_Space kind, newlines after
// punctuation, invalid-for-JS-but-valid-for-Rust whitespace) plus seeded random strings drawn from pools of
// characters that exercise each branch of the pre-tokenizers, plus the tinyshakespeare golden run when the text
// is given. Output: one JSON file {"gpt2": {"cases": [...], "shakespeare": {...}}, "cl100k": {...}}.
// usage: node test/test_tokenizer_vectors.js OUT.json [tinyshakespeare.txt]
"use strict";
const fs = require("fs");
const path = require("path");

const toolsDir = path.join(__dirname, "..", "dev", "data", "node_tools", "node_modules");
const { get_encoding } = require(path.join(toolsDir, "tiktoken"));

// xorshift32: a fixed seed gives the same cases on every machine
let state = 0x9e3779b9;
function rand() {
  state ^= state << 13; state >>>= 0;
  state ^= state >>> 17;
  state ^= state << 5; state >>>= 0;
  return state / 4294967296;
}
function pick(arr) { return arr[Math.floor(rand() * arr.length)]; }

const pools = [
  // ASCII words, digits, punctuation and whitespace
  "the", "The", "HELLO", "a", "xyz", "don", "I", "12", "3", "4567", "2024", "0x1F", ".", ",", "!", "?", "...", "()",
  "{}", "#", "//", "==", "'", "''", "\"", "-", "—", "_",
  " ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", "\t\n", "\u000b", "\u000c",
  // contractions, lower and other cases, and the long s (folds to s)
  "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'lL", "'D", "'\u017f", "'x",
  // letters and numbers beyond ASCII
  "café", "naïve", "Zürich", "Ελληνικά", "русский", "日本語", "中文", "한국어", "עברית", "العربية", "\u0301",
  "e\u0301", "½", "²", "Ⅻ", "٣٤", "①", "𝟘𝟙", "𝔘𝔫𝔦",
  // whitespace kinds (Unicode White_Space) and look-alikes that are not whitespace
  "\u00a0", "\u0085", "\u1680", "\u2000", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000",
  "\ufeff", "\u200b", "\u180e", "\u001c",
  // symbols, emoji (astral), and a private-use / unassigned code point
  "☕", "😀", "👍🏽", "€", "©", "→", "\ue000", "\u0378",
];

function randomText() {
  const n = 1 + Math.floor(rand() * 12);
  let s = "";
  for (let i = 0; i < n; i++) s += pick(pools);
  return s;
}

const fixed = [
  "", " ", "  ", "\n", "\n\n\n", " \n ", "a", "'s", "'S", "'ſ", "x'ſ", "'", "''", "'''s", "I'M DON'T WE'LL",
  "it'S They'RE we'Ve", "123", "1234", "1234567", " 123", "  123", "a1b2c3", "$1,000,000.00",
  "foo.\nBar", "foo.\r\n\r\nBar", "end.\n", "  \n  indented\n", "\t\tword", " \tword", "\u00a0word", "😀word",
  "(word", "((word", "\"quoted\"", "a  b", "a   b", "a \u3000b", "line\u2028next", "x\u0085y", " \u0085b",
  "a \ufeffb", "tab\tand\t\ttabs", "trailing  ", "trailing \n ", "\r\n\r\n", "café\u0301", "ǅungla",
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "=".repeat(300), " ".repeat(200) + "x", "\n".repeat(50) + "y", "ab".repeat(150), "🙂".repeat(40),
  "supercalifragilisticexpialidocious antidisestablishmentarianism",
];

function encodeAll(encName, texts) {
  const enc = get_encoding(encName);
  const cases = texts.map((text) => ({ text, ids: Array.from(enc.encode_ordinary(text)) }));
  return { enc, cases };
}

// FNV-1a over the ids (as 32-bit values), to compare a long encoding without storing it
function fnv(ids) {
  let h = 0xcbf29ce484222325n;
  const prime = 0x100000001b3n;
  const mask = 0xffffffffffffffffn;
  for (const id of ids) { h = ((h ^ BigInt(id)) * prime) & mask; }
  return h.toString(16).padStart(16, "0");
}

function main() {
  const out = process.argv[2];
  const shakespeare = process.argv[3];
  const texts = fixed.slice();
  for (let i = 0; i < 3000; i++) texts.push(randomText());
  const result = {
    generator: "npm tiktoken encode_ordinary (WASM build of the Rust core); test/test_tokenizer_vectors.js",
  };
  for (const [key, encName] of [["gpt2", "gpt2"], ["cl100k", "cl100k_base"]]) {
    const { enc, cases } = encodeAll(encName, texts);
    result[key] = { cases };
    if (shakespeare && fs.existsSync(shakespeare)) {
      const raw = fs.readFileSync(shakespeare, "utf8");
      const text = "<|endoftext|>" + raw.split("\n\n").join("\n\n<|endoftext|>");
      const ids = Array.from(enc.encode(text, ["<|endoftext|>"]));
      result[key].shakespeare = { tokens: ids.length, first16: ids.slice(0, 16), fnv1a64: fnv(ids) };
    }
    enc.free();
  }
  fs.writeFileSync(out, JSON.stringify(result));
  console.log(`wrote ${out}: ${texts.length} cases per encoding`);
}

main();
