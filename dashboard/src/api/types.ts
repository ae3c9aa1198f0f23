/**
 * Wire shapes of the control API, as `GET /state` and `GET /v1/events/stream` send them.
 *
 * Tagged unions arrive as one-key objects (`{"RunnerReady": {}}`); `tagOf`/`bodyOf` in
 * logic/derive.ts unwrap them. Only the fields the dashboard reads are typed.
 */

export type Tagged<T> = Record<string, T>;

export interface ShardMetadata {
  modelId: string;
  deviceRank: number;
  worldSize: number;
  startLayer: number;
  endLayer: number;
  nLayers: number;
  backend?: string;
}

export interface InstanceBody {
  instanceId: string;
  shardAssignments: {
    modelId: string;
    runnerToShard: Record<string, Tagged<ShardMetadata>>;
    nodeToRunner: Record<string, string>;
  };
  engine?: string;
  contextLimit?: number;
  excludedNodes?: string[];
}

export interface RunnerStatusBody {
  errorMessage?: string;
  layersLoaded?: number;
  totalLayers?: number;
}

export interface HealthReason {
  level: "ok" | "warn" | "error";
  message: string;
  remediation: string;
}

export interface NodeHealth {
  level: "ok" | "warn" | "error";
  reasons: HealthReason[];
}

export interface Bytes {
  inBytes: number;
}

export interface DownloadProgress {
  nodeId: string;
  modelId: string;
  downloadedBytes: number;
  totalBytes: number;
  phase: string;
}

export interface Connection {
  source: string;
  sink: string;
  kind?: string;
}

export interface InstanceFailure {
  instanceId: string;
  modelId: string;
  reason: string;
  at: string;
}

export interface ClusterState {
  instances: Record<string, Tagged<InstanceBody>>;
  runners: Record<string, Tagged<RunnerStatusBody>>;
  tasks: Record<string, Tagged<Record<string, unknown>>>;
  downloads: Record<string, Record<string, Tagged<{ totalBytes?: number; errorMessage?: string }>>>;
  topology: { nodes: string[]; missing: Connection[] };
  lastSeen: Record<string, string>;
  instanceFailures: InstanceFailure[];
  customModelCards: Record<string, unknown>;
  tracingEnabled: boolean;
  lastEventAppliedIdx: number;
  nodeIdentities: Record<string, { friendlyName?: string; skulkVersion?: string }>;
  nodeMemory: Record<string, { ramTotal?: Bytes; ramAvailable?: Bytes }>;
  nodeSystem: Record<string, { os?: string; arch?: string; cpuModel?: string; cpuCount?: number; python?: string }>;
  nodeResources: Record<string, { backends?: string[]; engineBuilds?: Record<string, string>; dataTransport?: string; apiPort?: number }>;
  nodeDisk: Record<string, { modelsDir?: string; totalBytes?: number; freeBytes?: number }>;
  downloadProgress: Record<string, DownloadProgress>;
  nodeHealth: Record<string, NodeHealth>;
  masterNodeId: string | null;
}

export interface Liveness {
  lastHeardS: number | null;
  reachable: boolean;
}

/** One message of `GET /v1/events/stream` (`event: state`). */
export interface StateMessage {
  seq: number;
  reason: "initial" | "change" | "tick";
  sentAt: number;
  observerNodeId: string;
  nodeTimeoutS: number | null;
  liveness: Record<string, Liveness>;
  state: ClusterState;
}

/** One entry of `GET /models`. */
export interface CatalogModel {
  id: string;
  name: string;
  tasks: string[];
  family?: string;
  quantization?: string;
  context_length?: number;
  storage_size?: number;
  n_layers?: number;
  capabilities?: string[];
  custom?: boolean;
  installed?: boolean;
  instances?: string[];
}

/** One entry of `GET /instance/previews`. */
export interface PlacementPreview {
  model_id: string;
  sharding: "Pipeline" | "Tensor";
  instance_meta: string;
  min_nodes: number;
  instance: Tagged<InstanceBody> | null;
  memory_delta_by_node: Record<string, number>;
  /** per node: the context and the figures admission used (absent from older nodes) */
  memory_by_node?: Record<string, NodeAdmission>;
  error: string | null;
}

export interface NodeAdmission {
  context_tokens: number;
  kv_cache_type: string;
  weights_bytes: number;
  kv_bytes: number;
  need_bytes: number;
}

export interface ApiErrorBody {
  error?: { message?: string; code?: string | null } | string;
}

/** One entry of `GET /v1/keys` (never the key itself: only `POST /v1/keys` shows it, once). */
export interface ApiKey {
  id: string;
  name: string;
  scope: "operator" | "inference";
  tokens_per_min: number | null;
  created_at: number;
  tokens_last_minute: number;
}

/** One span of `GET /v1/traces/{id}` (times in ns, each node's clock shifted onto the asker's). */
export interface Span {
  trace_id: string;
  span_id: string;
  parent_id: string | null;
  name: string;
  node_id: string;
  start_ns: number;
  end_ns: number;
  attributes: Record<string, string | number | boolean>;
}

export interface Trace {
  traceId: string;
  spans: Span[];
  nodes: string[];
  nodeNames: Record<string, string>;
  unanswered: Record<string, string>;
}

/** One entry of `GET /v1/diagnostics/cluster/timeline`: an event, a runner phase or a note. */
export interface TimelineEntry {
  at: number;
  kind: string;
  type?: string;
  idx?: number;
  nodeId?: string;
  nodeName?: string | null;
  seenBy?: string[];
  detail?: unknown;
  [key: string]: unknown;
}
