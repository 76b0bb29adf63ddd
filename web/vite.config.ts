// Builds the dashboard (`index.html`) and the GraphiQL page (`graphiql.html`) into
// `gateway/assets`, which the gateway embeds: `leasehold serve` alone serves them, with no
// request to another host. `npm run build` also records the sources' digest beside them
// (`scripts/source-hash.mjs`), so that a test can tell when they are stale.
import { resolve } from 'node:path';
import { defineConfig } from 'vite';

export default defineConfig({
  base: '/',
  esbuild: { jsx: 'automatic' },
  build: {
    outDir: resolve(import.meta.dirname, '../gateway/assets'),
    emptyOutDir: true,
    assetsDir: 'assets',
    sourcemap: false,
    // GraphiQL with React and CodeMirror is one chunk of about a megabyte; it loads once.
    chunkSizeWarningLimit: 2048,
    // Fonts and icons inline up to 4 KiB; larger ones are files served beside the page.
    assetsInlineLimit: 4096,
    rollupOptions: {
      // React packages mark themselves "use client" for server rendering, which a page built
      // for the browser alone has no use for: the build says so once per file otherwise.
      onwarn(warning, warn) {
        if (warning.code !== 'MODULE_LEVEL_DIRECTIVE') warn(warning);
      },
      input: {
        dashboard: resolve(import.meta.dirname, 'index.html'),
        graphiql: resolve(import.meta.dirname, 'graphiql.html'),
      },
    },
  },
});
