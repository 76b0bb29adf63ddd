// The digests of the pages' sources and of the files built from them, written beside the
// built files (`--write`, after `vite build`) or compared with those written there
// (`--check`). The gateway's test `the_embedded_pages_are_built_from_their_current_sources`
// computes both in Rust, so a source changed without `npm run build`, or a built file edited
// by hand, fails `cargo test`.
//
// A digest: SHA-256 over, for each file in byte order of its path (relative to the folder
// digested, dotfiles left out), the path, a newline, the SHA-256 of its bytes in hex, a newline.
import { createHash } from 'node:crypto';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';

const WEB = resolve(import.meta.dirname, '..');
const BUILT = resolve(WEB, '../gateway/assets');
const RECORD = join(BUILT, '.source-hash');
// What the built files are made from (the tests in `e2e/` and these scripts are not).
const SOURCES = ['index.html', 'graphiql.html', 'package.json', 'package-lock.json', 'tsconfig.json', 'vite.config.ts', 'src'];

function files(root, path) {
  if (path.split('/').pop().startsWith('.')) return [];
  const full = join(root, path);
  let entries;
  try {
    entries = readdirSync(full, { withFileTypes: true });
  } catch (error) {
    if (error.code === 'ENOTDIR') return [path];
    throw error;
  }
  return entries.flatMap((entry) => files(root, relative(root, join(full, entry.name))));
}

function digest(root, paths) {
  const sorted = paths.map((path) => path.split('\\').join('/'));
  sorted.sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
  const hash = createHash('sha256');
  for (const path of sorted) {
    const content = createHash('sha256').update(readFileSync(join(root, path))).digest('hex');
    hash.update(`${path}\n${content}\n`);
  }
  return hash.digest('hex');
}

function record() {
  const sources = digest(WEB, SOURCES.flatMap((path) => files(WEB, path)));
  const built = digest(BUILT, readdirSync(BUILT).flatMap((path) => files(BUILT, path)));
  return `sources ${sources}\nbuilt ${built}\n`;
}

const mode = process.argv[2];
if (mode === '--write') {
  writeFileSync(RECORD, record());
} else if (mode === '--check') {
  if (readFileSync(RECORD, 'utf8') !== record()) {
    console.error('gateway/assets is stale: run `npm run build` in web/ and commit the result');
    process.exit(1);
  }
}
