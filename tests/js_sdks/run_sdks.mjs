// The JavaScript SDKs against a real Skulk node (echo engine), as a new user would call them.
// Usage: node run_sdks.mjs <base url> <model>. Prints one JSON line per check: {name, ok, detail}.
// Exits 0 even when checks fail: the pytest module reads the lines and names each failure.
// maxOutputTokens: the Anthropic provider's default (4096) is the echo model's whole context.
import Anthropic from "@anthropic-ai/sdk";
import { createAnthropic } from "@ai-sdk/anthropic";
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateObject, generateText, jsonSchema, streamText, tool } from "ai";
import { Ollama } from "ollama";
import OpenAI from "openai";

const [base, model] = process.argv.slice(2);
const WEATHER = '/tool get_weather {"city":"Paris"}';
const weatherSchema = {
  type: "object",
  properties: { city: { type: "string" } },
  required: ["city"],
  additionalProperties: false,
};
const THINK = "/think first I weigh it | the answer is four";

const checks = [];
function check(name, fn) {
  checks.push([name, fn]);
}
function assert(cond, what) {
  if (!cond) throw new Error(what);
}

// --- openai --------------------------------------------------------------------------------------
const oa = new OpenAI({ baseURL: `${base}/v1`, apiKey: "x", maxRetries: 0 });
check("openai chat", async () => {
  const r = await oa.chat.completions.create({ model, messages: [{ role: "user", content: "hello there" }] });
  assert(r.choices[0].message.content === "hello there", JSON.stringify(r.choices[0]));
});
check("openai chat stream helper", async () => {
  const s = oa.chat.completions.stream({ model, messages: [{ role: "user", content: "hello there" }] });
  const done = await s.finalChatCompletion();
  assert(done.choices[0].message.content === "hello there", JSON.stringify(done));
});
check("openai chat required tool call", async () => {
  const r = await oa.chat.completions.create({
    model,
    tool_choice: "required",
    tools: [{ type: "function", function: { name: "get_weather", parameters: weatherSchema } }],
    messages: [{ role: "user", content: WEATHER }],
  });
  const call = r.choices[0].message.tool_calls[0];
  assert(r.choices[0].finish_reason === "tool_calls" && JSON.parse(call.function.arguments).city === "Paris", JSON.stringify(r));
});
check("openai responses stream + tool round trip", async () => {
  const tools = [{ type: "function", name: "get_weather", parameters: weatherSchema, strict: true }];
  const first = await oa.responses.create({ model, input: WEATHER, tools });
  const call = first.output.find((i) => i.type === "function_call");
  assert(call && call.call_id, JSON.stringify(first.output));
  const s = oa.responses.stream({
    model,
    tools,
    input: [
      { role: "user", content: "weather for Paris" },
      { type: "function_call", call_id: call.call_id, name: call.name, arguments: call.arguments },
      { type: "function_call_output", call_id: call.call_id, output: "18C" },
    ],
  });
  const final = await s.finalResponse();
  assert(final.output_text === "weather for Paris" && final.temperature === 1, JSON.stringify(final));
});

// --- @anthropic-ai/sdk ---------------------------------------------------------------------------
const an = new Anthropic({ baseURL: base, apiKey: "x", maxRetries: 0 });
check("anthropic messages + usage keys", async () => {
  const m = await an.messages.create({ model, max_tokens: 20, messages: [{ role: "user", content: "hello there" }] });
  assert(m.content[0].text === "hello there", JSON.stringify(m));
  assert("inference_geo" in m.usage && "output_tokens_details" in m.usage, JSON.stringify(m.usage));
});
check("anthropic stream stop_sequence", async () => {
  const s = an.messages.stream({
    model,
    max_tokens: 50,
    stop_sequences: ["fox"],
    messages: [{ role: "user", content: "the quick brown fox jumps" }],
  });
  const m = await s.finalMessage();
  assert(m.stop_reason === "stop_sequence" && m.stop_sequence === "fox", JSON.stringify(m));
  assert(m.content[0].text === "the quick brown ", JSON.stringify(m.content));
});
check("anthropic tool_use with a direct caller", async () => {
  const m = await an.messages.create({
    model,
    max_tokens: 20,
    tool_choice: { type: "any" },
    tools: [{ name: "get_weather", input_schema: weatherSchema }],
    messages: [{ role: "user", content: WEATHER }],
  });
  const block = m.content.find((b) => b.type === "tool_use");
  assert(block && block.input.city === "Paris" && block.caller?.type === "direct", JSON.stringify(m.content));
  assert(m.diagnostics === null && m.usage.speed === null, JSON.stringify(m));
});
check("anthropic thinking stream", async () => {
  const s = an.messages.stream({ model, max_tokens: 50, messages: [{ role: "user", content: THINK }] });
  const m = await s.finalMessage();
  assert(m.content.map((b) => b.type).join() === "thinking,text", JSON.stringify(m.content));
});

// --- the Vercel AI SDK ---------------------------------------------------------------------------
const compat = createOpenAICompatible({
  name: "skulk",
  baseURL: `${base}/v1`,
  apiKey: "x",
  supportsStructuredOutputs: true,
});
const openaiP = createOpenAI({ baseURL: `${base}/v1`, apiKey: "x" });
const anthropicP = createAnthropic({ baseURL: `${base}/v1`, apiKey: "x" });
const providers = {
  "openai-compatible": compat.chatModel(model),
  "openai (responses)": openaiP.responses(model),
  "openai (chat)": openaiP.chat(model),
  anthropic: anthropicP(model),
};
const weatherTool = tool({ description: "Current weather", inputSchema: jsonSchema(weatherSchema) });
for (const [label, lm] of Object.entries(providers)) {
  check(`ai ${label} generateText`, async () => {
    const r = await generateText({ model: lm, prompt: "hello there", maxRetries: 0, maxOutputTokens: 512 });
    assert(r.text === "hello there", JSON.stringify(r.text));
  });
  check(`ai ${label} streamText`, async () => {
    const r = streamText({ model: lm, prompt: "one two three", maxRetries: 0, maxOutputTokens: 512 });
    let text = "";
    for await (const part of r.fullStream) {
      if (part.type === "error") throw part.error;
      if (part.type === "text-delta") text += part.text;
    }
    assert(text === "one two three", JSON.stringify(text));
    assert((await r.finishReason) === "stop", await r.finishReason);
  });
  check(`ai ${label} required tool call`, async () => {
    const r = await generateText({
      model: lm,
      prompt: WEATHER,
      tools: { get_weather: weatherTool },
      toolChoice: "required",
      maxRetries: 0,
      maxOutputTokens: 512,
    });
    assert(r.toolCalls.length === 1 && r.toolCalls[0].input.city === "Paris", JSON.stringify(r.toolCalls));
  });
  check(`ai ${label} generateObject`, async () => {
    const r = await generateObject({
      model: lm,
      prompt: '{"name":"Tom","age":3}',
      schema: jsonSchema({
        type: "object",
        properties: { name: { type: "string" }, age: { type: "integer" } },
        required: ["name", "age"],
        additionalProperties: false,
      }),
      maxRetries: 0,
      maxOutputTokens: 512,
    });
    assert(r.object.name === "Tom" && r.object.age === 3, JSON.stringify(r.object));
  });
}

// --- ollama --------------------------------------------------------------------------------------
const ol = new Ollama({ host: base });
check("ollama chat stream + thinking", async () => {
  let thinking = "";
  let content = "";
  for await (const part of await ol.chat({ model, messages: [{ role: "user", content: THINK }], stream: true })) {
    thinking += part.message.thinking || "";
    content += part.message.content;
  }
  assert(thinking === "first I weigh it" && content === "the answer is four", JSON.stringify([thinking, content]));
});
check("ollama generate context + tools + list", async () => {
  const g = await ol.generate({ model, prompt: "alpha beta" });
  assert(g.response === "alpha beta" && g.context.length > 0, JSON.stringify(g));
  const c = await ol.chat({
    model,
    messages: [{ role: "user", content: WEATHER }],
    tools: [{ type: "function", function: { name: "get_weather", parameters: weatherSchema } }],
  });
  assert(c.message.tool_calls[0].function.arguments.city === "Paris", JSON.stringify(c.message));
  const names = (await ol.list()).models.map((m) => m.name);
  const short = model.split("/").pop();
  assert(names.includes(`${short}:latest`), JSON.stringify(names));
});

for (const [name, fn] of checks) {
  try {
    await fn();
    console.log(JSON.stringify({ name, ok: true }));
  } catch (err) {
    console.log(JSON.stringify({ name, ok: false, detail: String(err && (err.stack || err)).slice(0, 800) }));
  }
}
