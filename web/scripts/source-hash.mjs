// The digest of the pages' sources, written beside the built files (`--write`) or compared
// with the one written there (`--check`). The gateway's test
// `the_embedded_pages_are_built_from_their_current_sources` computes the same digest in Rust,
// so a source changed without `npm run build` fails `cargo test`.
//
// Digest: SHA-256 over, for each source file in byte order of its path relative to `web/`,
// the path, a newline, the SHA-256 of its bytes in hex, a newline.
import { createHash } from 'node:crypto';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';

const WEB = resolve(import.meta.dirname, '..');
const RECORD = resolve(WEB, '../gateway/assets/.source-hash');
// What the built files are made from (the tests in `e2e/` are not).
const SOURCES = ['index.html', 'graphiql.html', 'package-lock.json', 'tsconfig.json', 'vite.config.ts', 'src'];

function files(path) {
  const full = join(WEB, path);
  let entries;
  try {
    entries = readdirSync(full, { withFileTypes: true });
  } catch (error) {
    if (error.code === 'ENOTDIR') return [path];
    throw error;
  }
  return entries.flatMap((entry) => files(relative(WEB, join(full, entry.name))));
}

export function sourceHash() {
  const paths = SOURCES.flatMap(files).map((path) => path.split('\\').join('/'));
  paths.sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
  const digest = createHash('sha256');
  for (const path of paths) {
    const content = createHash('sha256').update(readFileSync(join(WEB, path))).digest('hex');
    digest.update(`${path}\n${content}\n`);
  }
  return digest.digest('hex');
}

const mode = process.argv[2];
if (mode === '--write') {
  writeFileSync(RECORD, `${sourceHash()}\n`);
} else if (mode === '--check') {
  const recorded = readFileSync(RECORD, 'utf8').trim();
  if (recorded !== sourceHash()) {
    console.error('gateway/assets is stale: run `npm run build` in web/ and commit the result');
    process.exit(1);
  }
}
