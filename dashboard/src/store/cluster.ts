/**
 * The cluster as the node pushes it: one stream of `/v1/events/stream`, one store.
 *
 * The node sends a message on every State change and every 2 s (telemetry), so nothing polls.
 * The stream is read with fetch, not EventSource, because it must carry the session's API key in
 * a header (EventSource cannot set one, and a key in the URL would reach access logs). Like
 * EventSource it reconnects a second after it drops; while it is down the last State is kept on
 * screen, marked stale. A 401 (the key was revoked: the node also ends a revoked key's stream)
 * signs the page out.
 */

import type { CatalogModel, StateMessage } from "../api/types";
import { api, errorFrom } from "../api/client";
import { SseParser } from "../logic/sse";
import { authHeaders, session } from "./session";
import { createStore, useStore } from "./store";

export type Connection = "connecting" | "live" | "reconnecting";

export interface ClusterStore {
  message: StateMessage | null;
  connection: Connection;
  receivedAt: number;
  catalog: CatalogModel[];
  catalogError: string | null;
  /** customModelCards count and instance count at the last catalog fetch: refetch when they move */
  catalogStamp: string;
}

export const cluster = createStore<ClusterStore>({
  message: null, connection: "connecting", receivedAt: 0, catalog: [], catalogError: null, catalogStamp: "",
});

/** Parse one `event: state` payload; a malformed one is dropped, not fatal. */
export function parseStateMessage(data: string): StateMessage | null {
  try {
    const msg = JSON.parse(data) as StateMessage;
    return msg && typeof msg === "object" && msg.state && msg.liveness ? msg : null;
  } catch {
    return null;
  }
}

export function catalogStamp(msg: StateMessage): string {
  const s = msg.state;
  return `${Object.keys(s.customModelCards).sort().join(",")}|${Object.keys(s.instances).sort().join(",")}|${Object.keys(s.downloads).length}`;
}

const RETRY_MS = 1000;
let running: AbortController | null = null;

function onState(data: string): void {
  const msg = parseStateMessage(data);
  if (!msg) return;
  cluster.set({ message: msg, connection: "live", receivedAt: Date.now() });
  if (session.get().scope === "operator" && catalogStamp(msg) !== cluster.get().catalogStamp) void refreshCatalog(msg);
}

/** Read one connection of the stream to its end; false when the node refused the key (stop). */
async function readOnce(url: string, signal: AbortSignal): Promise<boolean> {
  const response = await fetch(url, { headers: { accept: "text/event-stream", ...authHeaders() }, signal, cache: "no-store" });
  if (response.status === 401 || response.status === 403) {
    await errorFrom(response); // a 401 signs out with the node's reason
    return false;
  }
  if (!response.ok || !response.body) throw new Error(`${response.status} ${response.statusText}`);
  cluster.set({ connection: "live" });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const parser = new SseParser();
  for (;;) {
    const { value, done } = await reader.read();
    const out = done ? parser.end() : parser.feed(value);
    for (const event of out.events) if (event.event === "state") onState(event.data);
    if (done) return true;
  }
}

export function connect(url = "/v1/events/stream"): () => void {
  if (running) return () => undefined;
  const abort = new AbortController();
  running = abort;
  void (async () => {
    while (!abort.signal.aborted) {
      let again = true;
      try {
        again = await readOnce(url, abort.signal);
      } catch {
        // dropped or unreachable: retry below, as EventSource would
      }
      if (abort.signal.aborted || !again) break;
      cluster.set({ connection: "reconnecting" });
      await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
    }
  })();
  return () => {
    abort.abort();
    if (running === abort) running = null;
  };
}

export async function refreshCatalog(msg: StateMessage | null = cluster.get().message): Promise<void> {
  const stamp = msg ? catalogStamp(msg) : "";
  cluster.set({ catalogStamp: stamp });
  try {
    cluster.set({ catalog: await api.models(), catalogError: null });
  } catch (exc) {
    cluster.set({ catalogError: exc instanceof Error ? exc.message : String(exc), catalogStamp: "" });
  }
}

export const useMessage = () => useStore(cluster, (s) => s.message);
export const useConnection = () => useStore(cluster, (s) => s.connection);
export const useCatalog = () => useStore(cluster, (s) => s.catalog);
export const useCatalogError = () => useStore(cluster, (s) => s.catalogError);
