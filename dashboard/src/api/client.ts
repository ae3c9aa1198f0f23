/**
 * Typed calls to the node's control API. Errors become `ApiError` with the node's own message,
 * because the node's messages say what to do ("place one first with ...").
 *
 * Every call carries the session's API key (none on loopback); a 401 signs the page out.
 */

import { authHeaders, signedOut } from "../store/session";
import type { ApiErrorBody, ApiKey, CatalogModel, PlacementPreview, TimelineEntry, Trace } from "./types";

export class ApiError extends Error {
  constructor(message: string, readonly status: number, readonly code?: string | null) {
    super(message);
  }
}

export async function errorFrom(response: Response): Promise<ApiError> {
  let message = `${response.status} ${response.statusText}`;
  let code: string | null | undefined;
  try {
    const body = (await response.json()) as ApiErrorBody;
    if (typeof body.error === "string") message = body.error;
    else if (body.error?.message) {
      message = body.error.message;
      code = body.error.code;
    }
  } catch {
    // not JSON: keep the status line
  }
  if (response.status === 401) signedOut(message);
  return new ApiError(message, response.status, code);
}

export async function request<T>(path: string, init?: RequestInit): Promise<T> {
  const response = await fetch(path, {
    ...init,
    headers: { "content-type": "application/json", ...authHeaders(), ...(init?.headers ?? {}) },
  });
  if (!response.ok) throw await errorFrom(response);
  return (await response.json()) as T;
}

export const api = {
  models: () => request<{ data: CatalogModel[] }>("/models").then((r) => r.data),
  previews: (modelId: string) =>
    request<{ previews: PlacementPreview[] }>(`/instance/previews?model_id=${encodeURIComponent(modelId)}`)
      .then((r) => r.previews),
  place: (body: Record<string, unknown>) =>
    request<{ instance_id: string; message: string }>("/place_instance", { method: "POST", body: JSON.stringify(body) }),
  deleteInstance: (id: string) =>
    request<{ message: string }>(`/instance/${encodeURIComponent(id)}`, { method: "DELETE" }),
  addModel: (path: string, modelId?: string) =>
    request<{ message: string }>("/models/add", {
      method: "POST", body: JSON.stringify(modelId ? { path, model_id: modelId } : { path }),
    }),
  deleteCustomModel: (id: string) =>
    request<{ message: string }>(`/models/custom/${id.split("/").map(encodeURIComponent).join("/")}`, { method: "DELETE" }),
  keys: () => request<{ keys: ApiKey[] }>("/v1/keys").then((r) => r.keys),
  createKey: (body: { name: string; scope: string; tokens_per_min?: number }) =>
    request<ApiKey & { key: string; note: string }>("/v1/keys", { method: "POST", body: JSON.stringify(body) }),
  revokeKey: (id: string) =>
    request<{ revoked: string; name: string }>(`/v1/keys/${encodeURIComponent(id)}`, { method: "DELETE" }),
  setTracing: (enabled: boolean) =>
    request<{ enabled: boolean }>("/v1/tracing", { method: "PUT", body: JSON.stringify({ enabled }) }),
  traces: () => request<{ nodeId: string; tracingEnabled: boolean; traceIds: string[] }>("/v1/traces?limit=50"),
  trace: (id: string) => request<Trace>(`/v1/traces/${encodeURIComponent(id)}`),
  timeline: (limit = 60) => request<{ entries: TimelineEntry[]; unanswered: Record<string, string> }>(`/v1/diagnostics/cluster/timeline?limit=${limit}`),
  nodeDiagnostics: (nodeId: string) => request<Record<string, unknown>>(`/v1/diagnostics/cluster/${encodeURIComponent(nodeId)}`),
  cancel: (commandId: string) =>
    request<{ message: string }>(`/v1/cancel/${encodeURIComponent(commandId)}`, { method: "POST" }),
};
