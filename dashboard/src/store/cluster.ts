/**
 * The cluster as the node pushes it: one EventSource on `/v1/events/stream`, one store.
 *
 * The node sends a message on every State change and every 2 s (telemetry), so nothing polls.
 * EventSource reconnects by itself (the stream asks for 1 s); while it is down the last State is
 * kept on screen, marked stale.
 */

import type { CatalogModel, StateMessage } from "../api/types";
import { api } from "../api/client";
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

let source: EventSource | null = null;

export function connect(url = "/v1/events/stream"): () => void {
  if (source) return () => undefined;
  const es = new EventSource(url);
  source = es;
  es.addEventListener("open", () => cluster.set({ connection: "live" }));
  es.addEventListener("error", () => cluster.set({ connection: "reconnecting" }));
  es.addEventListener("state", (event) => {
    const msg = parseStateMessage((event as MessageEvent<string>).data);
    if (!msg) return;
    cluster.set({ message: msg, connection: "live", receivedAt: Date.now() });
    if (catalogStamp(msg) !== cluster.get().catalogStamp) void refreshCatalog(msg);
  });
  return () => {
    es.close();
    source = null;
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
