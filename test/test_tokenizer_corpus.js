// test_tokenizer_corpus.js: prints the ids npm tiktoken (WASM build of the Rust core) gives for a whole text file,
// one per line, with "<|endoftext|>" allowed as the EOT token, exactly like `./tokenize encode --eot`. For one-off
// checks of tokenizer.h on large real corpora (not part of make test: tiktoken runs at ~5 MB/s), e.g.
//   cmp <(./tokenize encode --eot --encoding cl100k < dev/data/large/large_train.txt) \
//       <(node test/test_tokenizer_corpus.js cl100k dev/data/large/large_train.txt)
// The file is encoded in pieces cut at "<|endoftext|>" so the WASM heap stays small; ids are unaffected.
"use strict";
const fs = require("fs");
const path = require("path");
const { get_encoding } = require(path.join(__dirname, "..", "dev", "data", "node_tools", "node_modules", "tiktoken"));

const [encArg, file] = process.argv.slice(2);
const enc = get_encoding(encArg === "cl100k" ? "cl100k_base" : "gpt2");
const text = fs.readFileSync(file, "utf8");
const EOT = "<|endoftext|>";
const out = fs.openSync("/dev/stdout", "w");
const docs = text.split(EOT);
docs.forEach((doc, i) => {
  const ids = Array.from(enc.encode_ordinary(doc));
  if (i + 1 < docs.length) ids.push(enc.encode(EOT, [EOT])[0]);
  if (ids.length) fs.writeSync(out, ids.join("\n") + "\n");
});
enc.free();
