import { describe, expect, it } from "vitest";
import type { PlacementPreview } from "../src/api/types";
import {
  applyChunk, loadConversations, prettyArguments, requestMessages, saveConversations, STORAGE_KEY, titleFor, type ChatMessage,
} from "../src/logic/chat";
import { formatAge, formatBytes, formatPercent, modelName } from "../src/logic/format";
import { contextLabel, defaultChoice, placementBody, previewChoices } from "../src/logic/previews";
import { SseParser } from "../src/logic/sse";
import { catalogStamp, parseStateMessage } from "../src/store/cluster";
import { createStore } from "../src/store/store";
import { pageFromPath } from "../src/store/ui";
import { A, B, message, pipelineInstance, state } from "./fixtures";

describe("SseParser", () => {
  it("parses events, comments and [DONE] split at arbitrary points", () => {
    const text = ": command_id abc\n\ndata: {\"a\":1}\n\nevent: state\ndata: x\ndata: y\n\n: generation_stats {}\n\ndata: [DONE]\n\n";
    for (const size of [1, 2, 3, 7, 1000]) {
      const p = new SseParser();
      const events: string[] = [];
      const comments: string[] = [];
      for (let i = 0; i < text.length; i += size) {
        const out = p.feed(text.slice(i, i + size));
        events.push(...out.events.map((e) => `${e.event}:${e.data}`));
        comments.push(...out.comments);
      }
      expect(events).toEqual(["message:{\"a\":1}", "state:x\ny", "message:[DONE]"]);
      expect(comments).toEqual(["command_id abc", "generation_stats {}"]);
    }
  });

  it("accepts CRLF line ends and an unterminated last event", () => {
    const p = new SseParser();
    const first = p.feed("data: one\r\n\r\ndata: two");
    expect(first.events.map((e) => e.data)).toEqual(["one"]);
    expect(p.end().events.map((e) => e.data)).toEqual(["two"]);
  });
});

describe("chat deltas", () => {
  const empty: ChatMessage = { role: "assistant", content: "" };

  it("keeps reasoning apart from content", () => {
    let m = applyChunk(empty, { choices: [{ delta: { reasoning_content: "think " } }] });
    m = applyChunk(m, { choices: [{ delta: { reasoning_content: "more" } }] });
    m = applyChunk(m, { choices: [{ delta: { content: "Hi" }, finish_reason: "stop" }] });
    expect(m).toMatchObject({ content: "Hi", reasoning: "think more", finishReason: "stop" });
    expect(empty.content).toBe("");
  });

  it("merges tool call fragments by index and shows whole calls", () => {
    let m = applyChunk(empty, { choices: [{ delta: { tool_calls: [{ index: 0, id: "call_1", function: { name: "get_weather", arguments: "{\"city\":" } }] } }] });
    m = applyChunk(m, { choices: [{ delta: { tool_calls: [{ index: 0, function: { arguments: "\"Paris\"}" } }, { index: 1, id: "c2", function: { name: "f", arguments: "{}" } }] } }] });
    expect(m.toolCalls).toEqual([
      { index: 0, id: "call_1", name: "get_weather", arguments: "{\"city\":\"Paris\"}" },
      { index: 1, id: "c2", name: "f", arguments: "{}" },
    ]);
    expect(prettyArguments(m.toolCalls![0]!.arguments)).toBe("{\n  \"city\": \"Paris\"\n}");
    expect(prettyArguments("{\"cit")).toBe("{\"cit");
  });

  it("records a stream error", () => {
    expect(applyChunk(empty, { error: { message: "runner crashed" } }).error).toBe("runner crashed");
  });

  it("sends past turns without annotations", () => {
    expect(requestMessages([{ role: "user", content: "a" }, { role: "assistant", content: "", error: "x" }, { role: "assistant", content: "b", reasoning: "r" }]))
      .toEqual([{ role: "user", content: "a" }, { role: "assistant", content: "b" }]);
    expect(titleFor("  hello\nworld")).toBe("hello");
    expect(titleFor("x".repeat(80))).toHaveLength(48);
  });

  it("keeps conversations in storage and survives corrupt data", () => {
    const data = new Map<string, string>();
    const storage = { getItem: (k: string) => data.get(k) ?? null, setItem: (k: string, v: string) => void data.set(k, v) };
    saveConversations(storage, [{ id: "c1", title: "t", model: "m", messages: [{ role: "user", content: "hi" }], updatedAt: 1 }]);
    expect(loadConversations(storage).map((c) => c.id)).toEqual(["c1"]);
    data.set(STORAGE_KEY, "{not json");
    expect(loadConversations(storage)).toEqual([]);
    data.set(STORAGE_KEY, JSON.stringify([{ id: 3 }, null, { id: "ok", messages: [] }]));
    expect(loadConversations(storage).map((c) => c.id)).toEqual(["ok"]);
  });
});

describe("placement previews", () => {
  const s = state({
    topology: { nodes: [A, B], missing: [] },
    nodeIdentities: { [A]: { friendlyName: "alpha" }, [B]: { friendlyName: "beta" } },
    nodeMemory: { [A]: { ramAvailable: { inBytes: 1000 } }, [B]: { ramAvailable: { inBytes: 500 } } },
  });
  const previews: PlacementPreview[] = [
    { model_id: "m", sharding: "Tensor", instance_meta: "MlxRing", min_nodes: 2, instance: null, memory_delta_by_node: {}, error: "hidden size not divisible by 2" },
    { model_id: "m", sharding: "Pipeline", instance_meta: "MlxRing", min_nodes: 2, instance: pipelineInstance("p", "m", [[A, 0, 20], [B, 20, 30]]), memory_delta_by_node: { [A]: 200, [B]: 100 }, error: null },
    { model_id: "m", sharding: "Pipeline", instance_meta: "MlxRing", min_nodes: 1, instance: pipelineInstance("q", "m", [[A, 0, 30]]), memory_delta_by_node: { [A]: 300 }, error: null },
    { model_id: "m", sharding: "Pipeline", instance_meta: "MlxRing", min_nodes: 1, instance: null, memory_delta_by_node: {}, error: "duplicate" },
  ];

  it("orders viable shapes first, smallest first, and keeps the planner's reasons", () => {
    const choices = previewChoices(previews, s);
    expect(choices.map((c) => [c.title, c.viable])).toEqual([
      ["Pipeline over 1 node", true], ["Pipeline over 2 nodes", true], ["Tensor over 2 nodes", false],
    ]);
    expect(choices[2]!.reason).toMatch(/not divisible/);
    expect(choices[1]!.nodes).toEqual([
      { nodeId: A, name: "alpha", delta: 200, freeBefore: 1000, freeAfter: 800, share: "layers 0–20 of 30" },
      { nodeId: B, name: "beta", delta: 100, freeBefore: 500, freeAfter: 400, share: "layers 20–30 of 30" },
    ]);
    expect(choices[1]!.totalDelta).toBe(300);
  });

  it("shows context and KV next to the weights when the planner reports them", () => {
    const withAdmission: PlacementPreview = {
      ...previews[2]!,
      memory_by_node: { [A]: { context_tokens: 32768, kv_cache_type: "q8_0", weights_bytes: 300, kv_bytes: 40, need_bytes: 420 } },
    };
    const [choice] = previewChoices([withAdmission], s);
    expect(choice!.title).toBe("Pipeline over 1 node · 32k context");
    expect([choice!.context, choice!.kvType]).toEqual([32768, "q8_0"]);
    expect(choice!.nodes[0]).toMatchObject({ delta: 420, weights: 300, kv: 40, freeAfter: 580 });
    expect(contextLabel(2048)).toBe("2k");
    expect(contextLabel(1500)).toBe("1500");
  });

  it("launches the chosen shape", () => {
    const choices = previewChoices(previews, s);
    expect(placementBody("m", defaultChoice(choices))).toEqual({ model_id: "m", sharding: "Pipeline", min_nodes: 1 });
    expect(placementBody("m", undefined)).toEqual({ model_id: "m" });
    expect(defaultChoice(previewChoices([previews[0]!], s))).toBeUndefined();
  });
});

describe("store", () => {
  it("notifies only on real changes", () => {
    const store = createStore({ a: 1, b: "x" });
    let calls = 0;
    const off = store.subscribe(() => calls++);
    store.set({ a: 1 });
    store.set({ a: 2 });
    store.set((s) => ({ b: s.b + "y" }));
    off();
    store.set({ a: 3 });
    expect(calls).toBe(2);
    expect(store.get()).toEqual({ a: 3, b: "xy" });
  });

  it("parses push messages and drops malformed ones", () => {
    const msg = message(state());
    expect(parseStateMessage(JSON.stringify(msg))?.observerNodeId).toBe(A);
    expect(parseStateMessage("{")).toBeNull();
    expect(parseStateMessage("{\"seq\":1}")).toBeNull();
  });

  it("refetches the catalog only when cards or instances change", () => {
    const one = message(state());
    const two = message(state({ lastEventAppliedIdx: 9 }));
    const three = message(state({ customModelCards: { "local/x": {} } }));
    expect(catalogStamp(one)).toBe(catalogStamp(two));
    expect(catalogStamp(one)).not.toBe(catalogStamp(three));
  });

  it("maps paths to pages without ever claiming API paths", () => {
    expect(pageFromPath("/ui/models")).toBe("models");
    expect(pageFromPath("/ui/chat/")).toBe("chat");
    expect(pageFromPath("/")).toBe("topology");
    expect(pageFromPath("/models")).toBe("topology");
    expect(pageFromPath("/ui/nope")).toBe("topology");
  });
});

describe("format", () => {
  it("formats bytes, percents, ages and names", () => {
    expect(formatBytes(0)).toBe("0 B");
    expect(formatBytes(1536)).toBe("1.50 KiB");
    expect(formatBytes(98_400_000)).toBe("93.8 MiB");
    expect(formatBytes(25 * 2 ** 30)).toBe("25.0 GiB");
    expect(formatBytes(null)).toBe("–");
    expect(formatPercent(1, 3)).toBe("33%");
    expect(formatPercent(5, 0)).toBe("0%");
    expect(formatAge(null)).toBe("never");
    expect(formatAge(42)).toBe("42 s ago");
    expect(modelName("HuggingFaceTB/SmolLM2-135M-Instruct")).toBe("SmolLM2-135M-Instruct");
  });
});
