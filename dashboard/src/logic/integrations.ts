/**
 * Client configuration written from live state: the models with a ready instance (their real
 * context window and capabilities), the node's address as this browser reaches it, and a key
 * placeholder. Pure functions, so the page and the unit tests share them.
 */

import type { CatalogModel, ClusterState } from "../api/types";
import { instanceViews } from "./derive";

export const KEY_PLACEHOLDER = "YOUR_SKULK_KEY";

export interface ServedModel {
  id: string;
  /** the largest context of its ready instances (the planner's choice), else the catalog's */
  context: number | null;
  capabilities: string[];
  instances: number;
}

/** Models with at least one ready instance, with what a client needs to know about them. */
export function servedModels(state: ClusterState, catalog: readonly CatalogModel[]): ServedModel[] {
  const byId = new Map<string, ServedModel>();
  for (const view of instanceViews(state)) {
    if (view.phase !== "ready") continue;
    const card = catalog.find((m) => m.id === view.modelId);
    const seen = byId.get(view.modelId);
    const context = Math.max(seen?.context ?? 0, view.contextLimit ?? 0) || card?.context_length || null;
    const capabilities = card?.capabilities?.length ? card.capabilities : card?.tasks ?? [];
    byId.set(view.modelId, { id: view.modelId, context, capabilities, instances: (seen?.instances ?? 0) + 1 });
  }
  return [...byId.values()].sort((a, b) => a.id.localeCompare(b.id));
}

/**
 * The address clients should use: the page's own origin when it was opened through a routable
 * address; on localhost, that origin only works on this host, which the page says.
 */
export function baseUrl(origin: string): { url: string; localOnly: boolean } {
  const host = new URL(origin).hostname;
  const localOnly = host === "localhost" || host === "[::1]" || host === "::1" || host.startsWith("127.");
  return { url: origin.replace(/\/$/, ""), localOnly };
}

export interface Snippet {
  id: string;
  title: string;
  /** what the text is: shown beside the title */
  where: string;
  language: string;
  text: string;
}

/** Every client's configuration for one model. */
export function snippets(base: string, model: ServedModel, key = KEY_PLACEHOLDER): Snippet[] {
  const m = model.id;
  const ctx = model.context ?? 8192;
  const v1 = `${base}/v1`;
  return [
    {
      id: "openai-python", title: "OpenAI SDK (Python)", where: "pip install openai", language: "python",
      text: `from openai import OpenAI\n\nclient = OpenAI(base_url="${v1}", api_key="${key}")\nreply = client.chat.completions.create(\n    model="${m}",\n    messages=[{"role": "user", "content": "Say hello in one short sentence."}],\n)\nprint(reply.choices[0].message.content)\n`,
    },
    {
      id: "openai-js", title: "OpenAI SDK (JavaScript)", where: "npm install openai", language: "javascript",
      text: `import OpenAI from "openai";\n\nconst client = new OpenAI({ baseURL: "${v1}", apiKey: "${key}" });\nconst reply = await client.chat.completions.create({\n  model: "${m}",\n  messages: [{ role: "user", content: "Say hello in one short sentence." }],\n});\nconsole.log(reply.choices[0].message.content);\n`,
    },
    {
      id: "anthropic-python", title: "Anthropic SDK (Python)", where: "pip install anthropic", language: "python",
      text: `import anthropic\n\nclient = anthropic.Anthropic(base_url="${base}", api_key="${key}")\nreply = client.messages.create(\n    model="${m}",\n    max_tokens=256,\n    messages=[{"role": "user", "content": "Say hello in one short sentence."}],\n)\nprint(reply.content[0].text)\n`,
    },
    {
      id: "ollama", title: "Ollama clients", where: "pip install ollama (or any client of the Ollama API)", language: "python",
      text: `from ollama import Client\n\nclient = Client(host="${base}", headers={"Authorization": "Bearer ${key}"})\nreply = client.chat(model="${m}", messages=[{"role": "user", "content": "Hello"}])\nprint(reply["message"]["content"])\n`,
    },
    {
      id: "open-webui", title: "Open WebUI", where: "environment of the Open WebUI container", language: "shell",
      text: `OPENAI_API_BASE_URL=${v1}\nOPENAI_API_KEY=${key}\n# or Admin Settings > Connections > OpenAI API: URL ${v1}, key ${key}\n# ${m} then shows in the model picker (context ${ctx} tokens)\n`,
    },
    {
      id: "continue", title: "Continue", where: "~/.continue/config.yaml", language: "yaml",
      text: `models:\n  - name: ${m} (Skulk)\n    provider: openai\n    model: ${m}\n    apiBase: ${v1}\n    apiKey: ${key}\n    defaultCompletionOptions:\n      contextLength: ${ctx}\n    roles: [chat, edit, apply]\n`,
    },
    {
      id: "aider", title: "aider", where: "shell", language: "shell",
      text: `export OPENAI_API_BASE=${v1}\nexport OPENAI_API_KEY=${key}\ncat > .aider.model.metadata.json <<'JSON'\n{"openai/${m}": {"max_input_tokens": ${ctx}, "max_tokens": ${ctx}, "litellm_provider": "openai", "mode": "chat"}}\nJSON\naider --model openai/${m}\n`,
    },
    {
      id: "llm", title: "llm (Simon Willison's CLI)", where: "extra-openai-models.yaml in `llm logs path`'s folder", language: "yaml",
      text: `- model_id: skulk-${m.split("/").pop()}\n  model_name: ${m}\n  api_base: ${v1}\n  api_key_name: skulk\n# then: llm keys set skulk   (paste ${key})\n#       llm -m skulk-${m.split("/").pop()} "Hello"\n`,
    },
    {
      id: "claude-code", title: "Claude Code-style tools", where: "shell (Anthropic Messages API)", language: "shell",
      text: `export ANTHROPIC_BASE_URL=${base}\nexport ANTHROPIC_AUTH_TOKEN=${key}\nexport ANTHROPIC_MODEL=${m}\nexport ANTHROPIC_SMALL_FAST_MODEL=${m}\nclaude\n`,
    },
  ];
}
