import { svelte } from '@sveltejs/vite-plugin-svelte';
import { defineConfig } from 'vitest/config';

// The console is served by the `endpoints` binary under /console/, with its assets under /console/assets/ named
// by content hash (the server gives them a year's cache lifetime).
export default defineConfig({
  base: '/console/',
  plugins: [svelte()],
  build: {
    outDir: 'dist',
    assetsDir: 'assets',
    target: 'es2022',
    // Everything is served from the binary; a small app does not need its chunks split for caching.
    chunkSizeWarningLimit: 1024,
    // No inline assets: the page's Content-Security-Policy allows images only from the server itself.
    assetsInlineLimit: 0,
  },
  server: {
    // `npm run dev` against a local `endpoints serve`.
    proxy: { '/api': process.env.ENDPOINTS_URL ?? 'http://127.0.0.1:8000' },
  },
  test: {
    include: ['src/**/*.test.ts'],
    environment: 'node',
  },
});
