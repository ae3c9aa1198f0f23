import type { ClusterState, StateMessage } from "../src/api/types";

export const A = "aaaaaaaa-0000-0000-0000-000000000001";
export const B = "bbbbbbbb-0000-0000-0000-000000000002";

export function state(over: Partial<ClusterState> = {}): ClusterState {
  return {
    instances: {}, runners: {}, tasks: {}, downloads: {}, topology: { nodes: [A], missing: [] }, lastSeen: {},
    instanceFailures: [], customModelCards: {}, tracingEnabled: false, lastEventAppliedIdx: 1,
    nodeIdentities: { [A]: { friendlyName: "alpha" } },
    nodeMemory: { [A]: { ramTotal: { inBytes: 16 * 2 ** 30 }, ramAvailable: { inBytes: 12 * 2 ** 30 } } },
    nodeSystem: {}, nodeResources: { [A]: { backends: ["llama_server-cpu"] } }, nodeDisk: {}, downloadProgress: {},
    nodeHealth: { [A]: { level: "ok", reasons: [] } }, masterNodeId: A, ...over,
  };
}

export function message(s: ClusterState, over: Partial<StateMessage> = {}): StateMessage {
  return {
    seq: 0, reason: "initial", sentAt: 0, observerNodeId: A, nodeTimeoutS: 30,
    liveness: Object.fromEntries(s.topology.nodes.map((n) => [n, { lastHeardS: 0.5, reachable: true }])),
    state: s, ...over,
  };
}

export function pipelineInstance(id: string, model: string, parts: [string, number, number][], n = 30) {
  const runnerToShard: Record<string, unknown> = {};
  const nodeToRunner: Record<string, string> = {};
  parts.forEach(([node, start, end], rank) => {
    const rid = `${id}-r${rank}`;
    runnerToShard[rid] = { PipelineShardMetadata: { modelId: model, deviceRank: rank, worldSize: parts.length, startLayer: start, endLayer: end, nLayers: n, backend: "llama_server-cpu" } };
    nodeToRunner[node] = rid;
  });
  return { MlxRingInstance: { instanceId: id, shardAssignments: { modelId: model, runnerToShard, nodeToRunner }, engine: "llamacpp", contextLimit: 8192 } } as ClusterState["instances"][string];
}
