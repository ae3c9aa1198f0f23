/**
 * Views derived from one State message: nodes with health, edges, instances with their shards.
 *
 * Pure functions of the message so they are unit-tested without a browser, and so every page
 * agrees on what "ready" or "error" means.
 */

import type {
  ClusterState, HealthReason, InstanceBody, Liveness, RunnerStatusBody, ShardMetadata, StateMessage, Tagged,
} from "../api/types";

export const HEARTBEAT_S = 2;
/** A peer not heard for this long is in error: three heartbeats missed. */
export const STALE_S = 3 * HEARTBEAT_S;

export function tagOf<T>(tagged: Tagged<T> | undefined | null): string {
  return tagged ? (Object.keys(tagged)[0] ?? "") : "";
}

export function bodyOf<T>(tagged: Tagged<T> | undefined | null): T | undefined {
  if (!tagged) return undefined;
  const key = Object.keys(tagged)[0];
  return key === undefined ? undefined : tagged[key];
}

export type Level = "ok" | "warn" | "error";

export interface NodeView {
  id: string;
  name: string;
  isMaster: boolean;
  isObserver: boolean;
  inTopology: boolean;
  ramTotal: number | null;
  ramFree: number | null;
  ramUsed: number | null;
  backends: string[];
  level: Level;
  reasons: HealthReason[];
  lastHeardS: number | null;
  system: ClusterState["nodeSystem"][string] | undefined;
  disk: ClusterState["nodeDisk"][string] | undefined;
  version: string | undefined;
}

const RANK: Record<Level, number> = { ok: 0, warn: 1, error: 2 };

export function worst(a: Level, b: Level): Level {
  return RANK[a] >= RANK[b] ? a : b;
}

/** The node's health as `/state` computes it, plus liveness as this observer sees it. */
export function nodeHealth(
  msg: StateMessage, nodeId: string,
): { level: Level; reasons: HealthReason[]; lastHeardS: number | null } {
  const base = msg.state.nodeHealth[nodeId] ?? { level: "ok", reasons: [] };
  const live: Liveness | undefined = msg.liveness[nodeId];
  const reasons = [...base.reasons];
  let level: Level = base.level;
  const lastHeardS = live?.lastHeardS ?? null;
  if (nodeId !== msg.observerNodeId) {
    const removal = msg.nodeTimeoutS
      ? `the master removes it ${Math.round(msg.nodeTimeoutS)} s after it was last heard`
      : "the master removes it after its node timeout";
    if (live && !live.reachable && msg.state.topology.nodes.includes(nodeId)) {
      reasons.unshift({
        level: "error", message: "no transport session with this node",
        remediation: `check that the node process is running and the network between the nodes; ${removal}`,
      });
      level = "error";
    } else if (lastHeardS === null || lastHeardS > STALE_S) {
      reasons.unshift({
        level: "error",
        message: lastHeardS === null ? "never heard from" : `not heard from for ${Math.round(lastHeardS)} s`,
        remediation: `check that the node process is running and reachable; ${removal}`,
      });
      level = "error";
    }
  }
  // "last heartbeat N s ago" from /state says the same as the liveness reason above
  const deduped = level === "error" && reasons[0]?.level === "error" && nodeId !== msg.observerNodeId
    ? reasons.filter((r, i) => i === 0 || !r.message.startsWith("last heartbeat"))
    : reasons;
  return { level: deduped.reduce<Level>((acc, r) => worst(acc, r.level), level), reasons: deduped, lastHeardS };
}

export function nodeViews(msg: StateMessage): NodeView[] {
  const s = msg.state;
  const ids = new Set<string>([...s.topology.nodes, ...Object.keys(s.nodeIdentities), ...Object.keys(msg.liveness)]);
  const views = [...ids].map((id): NodeView => {
    const memory = s.nodeMemory[id];
    const total = memory?.ramTotal?.inBytes ?? null;
    const free = memory?.ramAvailable?.inBytes ?? null;
    const health = nodeHealth(msg, id);
    return {
      id,
      name: s.nodeIdentities[id]?.friendlyName || id.slice(0, 8),
      isMaster: id === s.masterNodeId,
      isObserver: id === msg.observerNodeId,
      inTopology: s.topology.nodes.includes(id),
      ramTotal: total,
      ramFree: free,
      ramUsed: total != null && free != null ? Math.max(0, total - free) : null,
      backends: s.nodeResources[id]?.backends ?? [],
      level: health.level,
      reasons: health.reasons,
      lastHeardS: health.lastHeardS,
      system: s.nodeSystem[id],
      disk: s.nodeDisk[id],
      version: s.nodeIdentities[id]?.skulkVersion,
    };
  });
  // stable order: master first, then by name, so the map does not reshuffle on every message
  return views.sort((a, b) => Number(b.isMaster) - Number(a.isMaster) || a.name.localeCompare(b.name) || a.id.localeCompare(b.id));
}

export interface Edge {
  a: string;
  b: string;
  kinds: string[];
  bidirectional: boolean;
}

/** Undirected links between members: State records only the sessions a node reports missing, so
 * every other pair is linked. One side missing: a one-way link; both sides: no link. A link is
 * labelled with the transports its two ends report (`nodeResources.dataTransport`). */
export function edges(state: ClusterState): Edge[] {
  const missing = new Set(state.topology.missing.map((c) => `${c.source}|${c.sink}`));
  const nodes = [...new Set(state.topology.nodes)].sort();
  const transport = (id: string) => state.nodeResources?.[id]?.dataTransport;
  const found: Edge[] = [];
  nodes.forEach((a, i) => {
    for (const b of nodes.slice(i + 1)) {
      const ab = missing.has(`${a}|${b}`), ba = missing.has(`${b}|${a}`);
      const kinds = [...new Set([transport(a), transport(b)].filter((k): k is string => Boolean(k)))];
      if (!(ab && ba)) found.push({ a, b, kinds, bidirectional: !ab && !ba });
    }
  });
  return found;
}

export type InstancePhase = "ready" | "loading" | "starting" | "failed" | "stopping";

export interface ShardView {
  runnerId: string;
  nodeId: string | undefined;
  kind: string;
  shard: ShardMetadata | undefined;
  status: string;
  statusBody: RunnerStatusBody | undefined;
  /** "layers 0-15 of 30" or "tensor share 1/2" */
  label: string;
}

export interface InstanceView {
  id: string;
  kind: string;
  modelId: string;
  engine: string | undefined;
  contextLimit: number | undefined;
  sharding: "Pipeline" | "Tensor" | "Other";
  phase: InstancePhase;
  shards: ShardView[];
  nodes: string[];
  error: string | undefined;
}

const SERVING = new Set(["RunnerReady", "RunnerRunning"]);

export function shardLabel(kind: string, shard: ShardMetadata | undefined): string {
  if (!shard) return "unknown shard";
  if (kind === "TensorShardMetadata") return `tensor share ${shard.deviceRank + 1}/${shard.worldSize}`;
  if (kind === "PipelineShardMetadata") {
    return `layers ${shard.startLayer}–${shard.endLayer} of ${shard.nLayers}`;
  }
  return `${kind.replace(/ShardMetadata$/, "").toLowerCase()} rank ${shard.deviceRank + 1}/${shard.worldSize}`;
}

export function instancePhase(statuses: string[]): InstancePhase {
  if (statuses.length && statuses.every((s) => SERVING.has(s))) return "ready";
  if (statuses.some((s) => s === "RunnerFailed")) return "failed";
  if (statuses.some((s) => s === "RunnerShuttingDown" || s === "RunnerShutdown")) return "stopping";
  if (statuses.some((s) => s === "RunnerLoading" || s === "RunnerLoaded" || s === "RunnerWarmingUp")) return "loading";
  return "starting";
}

export function instanceView(id: string, tagged: Tagged<InstanceBody>, state: ClusterState): InstanceView {
  const body = bodyOf(tagged)!;
  const sa = body.shardAssignments;
  const runnerToNode = new Map(Object.entries(sa.nodeToRunner).map(([node, runner]) => [runner, node]));
  const shards = Object.entries(sa.runnerToShard).map(([runnerId, taggedShard]): ShardView => {
    const kind = tagOf(taggedShard);
    const shard = bodyOf(taggedShard);
    const status = state.runners[runnerId];
    return {
      runnerId, nodeId: runnerToNode.get(runnerId), kind, shard, status: tagOf(status) || "RunnerPending",
      statusBody: bodyOf(status), label: shardLabel(kind, shard),
    };
  }).sort((a, b) => (a.shard?.deviceRank ?? 0) - (b.shard?.deviceRank ?? 0));
  const kinds = new Set(shards.map((s) => s.kind));
  return {
    id, kind: tagOf(tagged), modelId: sa.modelId, engine: body.engine, contextLimit: body.contextLimit,
    sharding: kinds.has("TensorShardMetadata") ? "Tensor" : kinds.has("PipelineShardMetadata") ? "Pipeline" : "Other",
    phase: instancePhase(shards.map((s) => s.status)),
    shards, nodes: Object.keys(sa.nodeToRunner),
    error: shards.map((s) => s.statusBody?.errorMessage).find(Boolean),
  };
}

export function instanceViews(state: ClusterState): InstanceView[] {
  return Object.entries(state.instances)
    .map(([id, tagged]) => instanceView(id, tagged, state))
    .sort((a, b) => a.modelId.localeCompare(b.modelId) || a.id.localeCompare(b.id));
}

/** Loading progress of an instance in [0, 1], from `RunnerLoading{layersLoaded, totalLayers}`. */
export function loadProgress(view: InstanceView): number | null {
  const loading = view.shards.map((s) => s.statusBody).filter((b) => b?.totalLayers);
  if (!loading.length) return null;
  const done = loading.reduce((acc, b) => acc + (b!.layersLoaded ?? 0), 0);
  const total = loading.reduce((acc, b) => acc + (b!.totalLayers ?? 0), 0);
  return total ? done / total : null;
}

/** Models with at least one ready instance that can chat (embedding models cannot). */
export function chatModels(state: ClusterState, embeddingModels: ReadonlySet<string>): string[] {
  const ready = instanceViews(state).filter((v) => v.phase === "ready" && !embeddingModels.has(v.modelId));
  return [...new Set(ready.map((v) => v.modelId))].sort();
}

export interface DownloadView {
  nodeId: string;
  modelId: string;
  status: "pending" | "downloading" | "completed" | "failed";
  downloaded: number;
  total: number;
  error?: string;
  phase?: string;
}

/** Every download State knows of, with byte progress from telemetry where a node reports it. */
export function downloadViews(state: ClusterState): DownloadView[] {
  const out: DownloadView[] = [];
  for (const [nodeId, models] of Object.entries(state.downloads)) {
    for (const [modelId, status] of Object.entries(models)) {
      const tag = tagOf(status);
      const body = bodyOf(status);
      const live = state.downloadProgress[nodeId];
      const progress = live && live.modelId === modelId ? live : undefined;
      const total = progress?.totalBytes || body?.totalBytes || 0;
      if (tag === "DownloadCompletedStatus") {
        out.push({ nodeId, modelId, status: "completed", downloaded: total, total });
      } else if (tag === "DownloadFailedStatus") {
        out.push({ nodeId, modelId, status: "failed", downloaded: progress?.downloadedBytes ?? 0, total, error: body?.errorMessage });
      } else {
        out.push({
          nodeId, modelId, status: progress ? "downloading" : "pending",
          downloaded: progress?.downloadedBytes ?? 0, total, phase: progress?.phase,
        });
      }
    }
  }
  for (const [nodeId, progress] of Object.entries(state.downloadProgress)) {
    if (!out.some((d) => d.nodeId === nodeId && d.modelId === progress.modelId)) {
      // a download the store ran on its own (added from the hub): its last reading says when it is done
      const done = progress.totalBytes > 0 && progress.downloadedBytes >= progress.totalBytes;
      out.push({ nodeId, modelId: progress.modelId, status: done ? "completed" : "downloading", downloaded: progress.downloadedBytes,
        total: progress.totalBytes, phase: done ? undefined : progress.phase });
    }
  }
  const order = { downloading: 0, pending: 1, failed: 2, completed: 3 };
  return out.sort((a, b) => order[a.status] - order[b.status] || a.modelId.localeCompare(b.modelId));
}
