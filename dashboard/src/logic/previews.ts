/**
 * Placement previews (`GET /instance/previews`) turned into choices an operator can read.
 *
 * Each viable preview becomes "Pipeline over 2 nodes: node a +60 MiB (12.1 GiB free after)";
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
    const nodes = Object.entries(p.memory_delta_by_node).map(([nodeId, delta]): NodeImpact => {
      const free = state?.nodeMemory[nodeId]?.ramAvailable?.inBytes ?? null;
      const runner = instance?.shardAssignments.nodeToRunner[nodeId];
      const shard = runner ? bodyOf(runnerToShard[runner]) : undefined;
      const tensor = p.sharding === "Tensor";
      return {
        nodeId, name: state?.nodeIdentities[nodeId]?.friendlyName || nodeId.slice(0, 8), delta,
        freeBefore: free, freeAfter: free == null ? null : free - delta,
        share: !shard ? "" : tensor ? `tensor share ${shard.deviceRank + 1}/${shard.worldSize}`
          : `layers ${shard.startLayer}–${shard.endLayer} of ${shard.nLayers}`,
      };
    }).sort((a, b) => a.name.localeCompare(b.name));
    const width = nodes.length || p.min_nodes;
    out.push({
      key, sharding: p.sharding, minNodes: p.min_nodes, viable: !p.error && !!p.instance,
      reason: p.error, nodes, totalDelta: nodes.reduce((acc, n) => acc + n.delta, 0),
      title: `${p.sharding} over ${width} node${width === 1 ? "" : "s"}`,
    });
  }
  return out.sort((a, b) => Number(b.viable) - Number(a.viable) || a.minNodes - b.minNodes
    || (a.sharding === b.sharding ? 0 : a.sharding === "Pipeline" ? -1 : 1));
}

export function defaultChoice(choices: PreviewChoice[]): PreviewChoice | undefined {
  return choices.find((c) => c.viable);
}

/** The body for `POST /place_instance` that reproduces a chosen preview. */
export function placementBody(modelId: string, choice: PreviewChoice | undefined): Record<string, unknown> {
  return choice ? { model_id: modelId, sharding: choice.sharding, min_nodes: choice.minNodes } : { model_id: modelId };
}
