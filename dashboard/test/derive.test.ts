import { describe, expect, it } from "vitest";
import {
  chatModels, downloadViews, edges, instancePhase, instanceViews, loadProgress, nodeHealth, nodeViews, shardLabel,
} from "../src/logic/derive";
import { A, B, message, pipelineInstance, state } from "./fixtures";

describe("nodes", () => {
  it("reports name, memory used and free, backends", () => {
    const [node] = nodeViews(message(state()));
    expect(node).toMatchObject({ id: A, name: "alpha", isMaster: true, isObserver: true, backends: ["llama_server-cpu"] });
    expect(node!.ramFree).toBe(12 * 2 ** 30);
    expect(node!.ramUsed).toBe(4 * 2 ** 30);
    expect(node!.level).toBe("ok");
  });

  it("turns a peer without a session into an error with remediation and the removal timeout", () => {
    const s = state({ topology: { nodes: [A, B], missing: [] } });
    const msg = message(s, { liveness: { [A]: { lastHeardS: 0, reachable: true }, [B]: { lastHeardS: 1, reachable: false } } });
    const health = nodeHealth(msg, B);
    expect(health.level).toBe("error");
    expect(health.reasons[0]!.message).toMatch(/no transport session/);
    expect(health.reasons[0]!.remediation).toMatch(/30 s/);
  });

  it("turns a silent peer into an error and drops the duplicate heartbeat warning", () => {
    const s = state({
      topology: { nodes: [A, B], missing: [] },
      nodeHealth: { [B]: { level: "warn", reasons: [{ level: "warn", message: "last heartbeat 12s ago", remediation: "x" }] } },
    });
    const msg = message(s, { liveness: { [A]: { lastHeardS: 0, reachable: true }, [B]: { lastHeardS: 12, reachable: true } } });
    const health = nodeHealth(msg, B);
    expect(health.level).toBe("error");
    expect(health.reasons.map((r) => r.message)).toEqual(["not heard from for 12 s"]);
  });

  it("never marks the observing node stale and keeps server reasons", () => {
    const s = state({ nodeHealth: { [A]: { level: "warn", reasons: [{ level: "warn", message: "disk low", remediation: "free space" }] } } });
    const health = nodeHealth(message(s, { liveness: {} }), A);
    expect(health).toMatchObject({ level: "warn", reasons: [{ message: "disk low" }] });
  });

  it("orders the master first", () => {
    const s = state({ topology: { nodes: [A, B], missing: [] }, masterNodeId: B, nodeIdentities: { [A]: { friendlyName: "a" }, [B]: { friendlyName: "z" } } });
    expect(nodeViews(message(s)).map((n) => n.id)).toEqual([B, A]);
  });
});

describe("edges", () => {
  it("links every pair of members when no session is missing, labelled with their transports", () => {
    const s = state({ topology: { nodes: [B, A], missing: [] }, nodeResources: { [A]: { dataTransport: "zenoh" }, [B]: { dataTransport: "zenoh" } } });
    expect(edges(s)).toEqual([{ a: A, b: B, kinds: ["zenoh"], bidirectional: true }]);
  });

  it("makes a link one-way when one side reports it missing, and drops it when both do", () => {
    const one = state({ topology: { nodes: [A, B], missing: [{ source: B, sink: A }] } });
    expect(edges(one)).toEqual([{ a: A, b: B, kinds: [], bidirectional: false }]);
    const both = state({ topology: { nodes: [A, B], missing: [{ source: B, sink: A }, { source: A, sink: B }] } });
    expect(edges(both)).toEqual([]);
  });
});

describe("instances", () => {
  const inst = pipelineInstance("i1", "m/chat", [[A, 0, 18], [B, 18, 30]]);

  it("says which node holds which layers", () => {
    const s = state({ instances: { i1: inst }, runners: { "i1-r0": { RunnerReady: {} }, "i1-r1": { RunnerLoading: { layersLoaded: 3, totalLayers: 12 } } } });
    const [view] = instanceViews(s);
    expect(view!.shards.map((x) => [x.nodeId, x.label])).toEqual([[A, "layers 0–18 of 30"], [B, "layers 18–30 of 30"]]);
    expect(view!.phase).toBe("loading");
    expect(view!.sharding).toBe("Pipeline");
    expect(loadProgress(view!)).toBeCloseTo(0.25);
  });

  it("labels tensor shares", () => {
    expect(shardLabel("TensorShardMetadata", { modelId: "m", deviceRank: 1, worldSize: 2, startLayer: 0, endLayer: 30, nLayers: 30 }))
      .toBe("tensor share 2/2");
  });

  it("is ready only when every runner serves", () => {
    expect(instancePhase(["RunnerReady", "RunnerRunning"])).toBe("ready");
    expect(instancePhase(["RunnerReady", "RunnerFailed"])).toBe("failed");
    expect(instancePhase(["RunnerReady", "RunnerPending"])).toBe("starting");
    expect(instancePhase([])).toBe("starting");
  });

  it("offers only ready non-embedding models for chat", () => {
    const s = state({
      instances: { i1: inst, e1: pipelineInstance("e1", "m/embed", [[A, 0, 6]], 6) },
      runners: { "i1-r0": { RunnerReady: {} }, "i1-r1": { RunnerRunning: {} }, "e1-r0": { RunnerReady: {} } },
    });
    expect(chatModels(s, new Set(["m/embed"]))).toEqual(["m/chat"]);
    expect(chatModels(state({ instances: { i1: inst }, runners: {} }), new Set())).toEqual([]);
  });
});

describe("downloads", () => {
  it("joins State's download status with telemetry progress", () => {
    const s = state({
      downloads: { [A]: { "m/a": { DownloadPendingStatus: {} }, "m/b": { DownloadCompletedStatus: { totalBytes: 100 } }, "m/c": { DownloadFailedStatus: { errorMessage: "disk full" } } } },
      downloadProgress: { [A]: { nodeId: A, modelId: "m/a", downloadedBytes: 25, totalBytes: 100, phase: "fetching" } },
    });
    expect(downloadViews(s).map((d) => [d.modelId, d.status, d.downloaded, d.total, d.error])).toEqual([
      ["m/a", "downloading", 25, 100, undefined],
      ["m/c", "failed", 0, 0, "disk full"],
      ["m/b", "completed", 100, 100, undefined],
    ]);
  });
});
