import { describe, expect, it } from "vitest";
import type { CatalogModel } from "../src/api/types";
import { baseUrl, KEY_PLACEHOLDER, servedModels, snippets } from "../src/logic/integrations";
import { signInLink } from "../src/pages/Keys";
import { A, pipelineInstance, state } from "./fixtures";

const catalog: CatalogModel[] = [
  { id: "m/chat", name: "chat", tasks: ["TextGeneration"], context_length: 4096, capabilities: ["text", "tools"] },
];

describe("integrations", () => {
  it("lists only models with a ready instance, with the instance's context", () => {
    const s = state({
      instances: { i1: pipelineInstance("i1", "m/chat", [[A, 0, 30]]), i2: pipelineInstance("i2", "m/loading", [[A, 0, 30]]) },
      runners: { "i1-r0": { RunnerReady: {} }, "i2-r0": { RunnerLoading: {} } },
    });
    const served = servedModels(s, catalog);
    expect(served).toEqual([{ id: "m/chat", context: 8192, capabilities: ["text", "tools"], instances: 1 }]);
  });

  it("says when the page's address only works on the node's host", () => {
    expect(baseUrl("http://127.0.0.1:52415")).toEqual({ url: "http://127.0.0.1:52415", localOnly: true });
    expect(baseUrl("http://10.0.0.5:52415/")).toEqual({ url: "http://10.0.0.5:52415", localOnly: false });
  });

  it("writes every client's configuration with the address, model, context and key placeholder", () => {
    const all = snippets("http://10.0.0.5:52415", { id: "m/chat", context: 8192, capabilities: [], instances: 1 });
    expect(all.map((s) => s.id)).toEqual([
      "openai-python", "openai-js", "anthropic-python", "ollama", "open-webui", "continue", "aider", "llm", "claude-code",
    ]);
    for (const s of all) {
      expect(s.text).toContain("10.0.0.5:52415");
      expect(s.text).toContain(KEY_PLACEHOLDER);
      expect(s.text).toContain("m/chat");
    }
    expect(all.find((s) => s.id === "continue")!.text).toContain("contextLength: 8192");
    expect(all.find((s) => s.id === "openai-python")!.text).toContain('base_url="http://10.0.0.5:52415/v1"');
  });

  it("puts a new key in the sign-in link's fragment", () => {
    expect(signInLink("http://10.0.0.5:1/", "skulk-ab-c/d")).toBe("http://10.0.0.5:1/ui/#key=skulk-ab-c%2Fd");
  });
});

describe("downloads the store ran on its own", () => {
  it("are complete when the last reading has every byte", async () => {
    const { downloadViews } = await import("../src/logic/derive");
    const reading = (done: number) => state({
      downloadProgress: { [A]: { nodeId: A, modelId: "o/m", downloadedBytes: done, totalBytes: 100, phase: "downloading: m.gguf" } },
    });
    expect(downloadViews(reading(40))[0]).toMatchObject({ status: "downloading", downloaded: 40, total: 100 });
    expect(downloadViews(reading(100))[0]).toMatchObject({ status: "completed", total: 100 });
  });
});

describe("encodeWav", () => {
  it("writes a 16-bit mono PCM WAV header and clips the samples", async () => {
    const { encodeWav } = await import("../src/logic/wav");
    const buffer = encodeWav(new Float32Array([0, 1, -1, 2]), 16000);
    const view = new DataView(buffer);
    const text = (at: number) => String.fromCharCode(...new Uint8Array(buffer, at, 4));
    expect([text(0), text(8), text(12), text(36)]).toEqual(["RIFF", "WAVE", "fmt ", "data"]);
    expect([view.getUint16(22, true), view.getUint32(24, true), view.getUint16(34, true), view.getUint32(40, true)]).toEqual([1, 16000, 16, 8]);
    expect([view.getInt16(44, true), view.getInt16(46, true), view.getInt16(48, true), view.getInt16(50, true)]).toEqual([0, 32767, -32768, 32767]);
  });
});
