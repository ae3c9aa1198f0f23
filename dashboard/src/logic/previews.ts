/**
 * Placement previews (`GET /instance/previews`) turned into choices an operator can read.
 *
 * Each viable preview becomes "Pipeline over 2 nodes · 32k context: node a weights 4.6 GiB + KV 4 GiB";
 * the admission figure (weights x overhead + KV at the preview's context + floor) is what the node
 * gives up, when the planner reports it (`memory_by_node`); older nodes report weights only.
 * each impossible one keeps the planner's own reason. The default choice is what
 * `POST /place_instance` picks with no options: the smallest viable shape, pipeline first.
 */

import type { ClusterState, PlacementPreview } from "../api/types";
import { bodyOf } from "./derive";

export interface NodeImpact {
  nodeId: string;
  name: string;
  delta: number;
  freeBefore: number | null;
  freeAfter: number | null;
  /** "layers 0–15 of 30" */
  share: string;
  /** bytes of weights and of KV cache this node holds, and the context they were sized for */
  weights?: number;
  kv?: number;
}

export interface PreviewChoice {
  key: string;
  sharding: "Pipeline" | "Tensor";
  minNodes: number;
  viable: boolean;
  reason: string | null;
  nodes: NodeImpact[];
  totalDelta: number;
  title: string;
  /** the instance's context in tokens and its KV cache type, when the planner said */
  context?: number;
  kvType?: string;
}

export function previewKey(p: Pick<PlacementPreview, "sharding" | "min_nodes">): string {
  return `${p.sharding}:${p.min_nodes}`;
}

export function previewChoices(previews: PlacementPreview[], state: ClusterState | null): PreviewChoice[] {
  const seen = new Set<string>();
  const out: PreviewChoice[] = [];
  for (const p of previews) {
    const key = previewKey(p);
    if (seen.has(key)) continue;
    seen.add(key);
    const instance = bodyOf(p.instance);
    const runnerToShard = instance?.shardAssignments.runnerToShard ?? {};
    const nodes = Object.entries(p.memory_delta_by_node).map(([nodeId, weightsDelta]): NodeImpact => {
      const admitted = p.memory_by_node?.[nodeId];
      const delta = admitted?.need_bytes ?? weightsDelta;
      const free = state?.nodeMemory[nodeId]?.ramAvailable?.inBytes ?? null;
      const runner = instance?.shardAssignments.nodeToRunner[nodeId];
      const shard = runner ? bodyOf(runnerToShard[runner]) : undefined;
      const tensor = p.sharding === "Tensor";
      return {
        nodeId, name: state?.nodeIdentities[nodeId]?.friendlyName || nodeId.slice(0, 8), delta,
        freeBefore: free, freeAfter: free == null ? null : free - delta,
        share: !shard ? "" : tensor ? `tensor share ${shard.deviceRank + 1}/${shard.worldSize}`
          : `layers ${shard.startLayer}–${shard.endLayer} of ${shard.nLayers}`,
        ...(admitted ? { weights: admitted.weights_bytes, kv: admitted.kv_bytes } : {}),
      };
    }).sort((a, b) => a.name.localeCompare(b.name));
    const width = nodes.length || p.min_nodes;
    const admission = Object.values(p.memory_by_node ?? {})[0];
    out.push({
      key, sharding: p.sharding, minNodes: p.min_nodes, viable: !p.error && !!p.instance,
      reason: p.error, nodes, totalDelta: nodes.reduce((acc, n) => acc + n.delta, 0),
      title: `${p.sharding} over ${width} node${width === 1 ? "" : "s"}`
        + (admission ? ` · ${contextLabel(admission.context_tokens)} context` : ""),
      ...(admission ? { context: admission.context_tokens, kvType: admission.kv_cache_type } : {}),
    });
  }
  return out.sort((a, b) => Number(b.viable) - Number(a.viable) || a.minNodes - b.minNodes
    || (a.sharding === b.sharding ? 0 : a.sharding === "Pipeline" ? -1 : 1));
}

/** 32768 -> "32k", 2048 -> "2k", 1500 -> "1500" */
export function contextLabel(tokens: number): string {
  return tokens >= 1024 && tokens % 1024 === 0 ? `${tokens / 1024}k` : String(tokens);
}

export function defaultChoice(choices: PreviewChoice[]): PreviewChoice | undefined {
  return choices.find((c) => c.viable);
}

/** The body for `POST /place_instance` that reproduces a chosen preview. */
export function placementBody(modelId: string, choice: PreviewChoice | undefined): Record<string, unknown> {
  return choice ? { model_id: modelId, sharding: choice.sharding, min_nodes: choice.minNodes } : { model_id: modelId };
}
