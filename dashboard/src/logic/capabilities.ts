/**
 * The providers plugin's capability descriptors (`GET /v1/capabilities`, docs/extensions.md)
 * grouped per node for the Observe page: each node's capabilities in a stable order, the nodes
 * that could not be asked with the reason, and names from State rather than bare ids.
 */

export interface CapabilityEntry {
  node_id: string;
  ready: boolean;
  id: string;
  version: string;
  mode: string;
  description?: string;
  ref?: string;
  revision?: string;
}

export interface CapabilitiesAnswer {
  data?: CapabilityEntry[];
  unreachable?: Record<string, string>;
}

export interface NodeCapabilities {
  nodeId: string;
  name: string;
  capabilities: CapabilityEntry[];
  /** Why the node's descriptors could not be fetched, when they could not. */
  error: string | null;
}

/** Per node, sorted by node name then capability id and version. */
export function capabilitiesByNode(answer: CapabilitiesAnswer, names: ReadonlyMap<string, string>): NodeCapabilities[] {
  const byNode = new Map<string, NodeCapabilities>();
  const group = (nodeId: string) => {
    let g = byNode.get(nodeId);
    if (!g) byNode.set(nodeId, (g = { nodeId, name: names.get(nodeId) ?? nodeId.slice(0, 12), capabilities: [], error: null }));
    return g;
  };
  for (const entry of answer.data ?? []) group(entry.node_id).capabilities.push(entry);
  for (const [nodeId, reason] of Object.entries(answer.unreachable ?? {})) group(nodeId).error = reason;
  const groups = [...byNode.values()].sort((a, b) => a.name.localeCompare(b.name) || a.nodeId.localeCompare(b.nodeId));
  for (const g of groups) g.capabilities.sort((a, b) => a.id.localeCompare(b.id) || a.version.localeCompare(b.version));
  return groups;
}

/** Whether a node's diagnostics name the providers plugin (the page's section shows only then). */
export function hasProviders(diagnostics: { runtime?: { plugins?: string[] } } | null | undefined): boolean {
  return diagnostics?.runtime?.plugins?.includes("providers") ?? false;
}
