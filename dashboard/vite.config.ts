import { defineConfig } from "vitest/config";
import react from "@vitejs/plugin-react";

// Pages and assets live under /ui/ so no dashboard path can shadow an API route of the node.
// `npm run dev` proxies the API to a node on 52415 (override with SKULK_URL).
const target = process.env.SKULK_URL ?? "http://127.0.0.1:52415";
const api = ["/state", "/models", "/instance", "/place_instance", "/v1", "/node_id", "/events"];

export default defineConfig({
  base: "/ui/",
  plugins: [react()],
  build: { outDir: "dist", sourcemap: false, target: "es2022", chunkSizeWarningLimit: 400 },
  server: { proxy: Object.fromEntries(api.map((p) => [p, { target, changeOrigin: true }])) },
  test: { include: ["test/**/*.test.ts"], environment: "node" },
});
