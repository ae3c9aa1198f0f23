/**
 * Chat conversations: applying streamed deltas, and keeping conversations in localStorage.
 *
 * Deltas follow OpenAI Chat Completions: `content`, `reasoning_content` (shown apart, as the
 * model's thinking), and `tool_calls` (the node sends each call whole; fragments are merged by
 * `index` anyway so other servers' streams render too).
 */

import { userContent, type ContentPart } from "./images";

export interface ToolCallView {
  index: number;
  id?: string;
  name: string;
  arguments: string;
}

export interface ChatMessage {
  role: "user" | "assistant" | "system";
  content: string;
  /** Images sent with a user turn, as data URLs (vision models only). */
  images?: string[];
  reasoning?: string;
  toolCalls?: ToolCallView[];
  error?: string;
  finishReason?: string | null;
  stopped?: boolean;
  stats?: { generation_tps?: number; generation_tokens?: number; ttft_ms?: number };
}

export interface Conversation {
  id: string;
  title: string;
  model: string;
  messages: ChatMessage[];
  updatedAt: number;
}

export interface ChunkDelta {
  content?: string | null;
  reasoning_content?: string | null;
  reasoning?: string | null;
  tool_calls?: { index?: number; id?: string; function?: { name?: string; arguments?: string } }[];
}

export interface ChatChunk {
  choices?: { delta?: ChunkDelta; finish_reason?: string | null }[];
  error?: { message?: string };
}

/** The assistant message after one chunk (a new object; the input is not modified). */
export function applyChunk(message: ChatMessage, chunk: ChatChunk): ChatMessage {
  if (chunk.error) return { ...message, error: chunk.error.message ?? "the stream failed" };
  const choice = chunk.choices?.[0];
  if (!choice) return message;
  const next: ChatMessage = { ...message };
  const delta = choice.delta ?? {};
  if (delta.content) next.content = message.content + delta.content;
  const thinking = delta.reasoning_content ?? delta.reasoning;
  if (thinking) next.reasoning = (message.reasoning ?? "") + thinking;
  if (delta.tool_calls?.length) {
    const calls = [...(message.toolCalls ?? [])];
    for (const [i, part] of delta.tool_calls.entries()) {
      const index = part.index ?? i;
      const at = calls.findIndex((c) => c.index === index);
      const prev = at >= 0 ? calls[at]! : { index, name: "", arguments: "" };
      const merged: ToolCallView = {
        index, id: part.id ?? prev.id, name: prev.name + (part.function?.name ?? ""),
        arguments: prev.arguments + (part.function?.arguments ?? ""),
      };
      if (at >= 0) calls[at] = merged;
      else calls.push(merged);
    }
    next.toolCalls = calls;
  }
  if (choice.finish_reason) next.finishReason = choice.finish_reason;
  return next;
}

/** Pretty JSON for a tool call's arguments, or the raw text when it is not (yet) JSON. */
export function prettyArguments(text: string): string {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

/** The messages sent to the model: past turns without the dashboard's own annotations. */
export function requestMessages(messages: ChatMessage[]): { role: string; content: string | ContentPart[] }[] {
  return messages
    .filter((m) => !m.error || m.content)
    .map((m) => ({ role: m.role, content: m.role === "user" ? userContent(m.content, m.images) : m.content }));
}

export function titleFor(text: string): string {
  const line = text.trim().split("\n")[0] ?? "";
  return line.length > 48 ? `${line.slice(0, 47)}…` : line || "New chat";
}

export const STORAGE_KEY = "skulk.conversations.v1";
const MAX_CONVERSATIONS = 50;

export interface KeyValueStorage {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
}

export function loadConversations(storage: KeyValueStorage | undefined): Conversation[] {
  if (!storage) return [];
  try {
    const raw = JSON.parse(storage.getItem(STORAGE_KEY) ?? "[]") as unknown;
    if (!Array.isArray(raw)) return [];
    return raw.filter((c): c is Conversation =>
      !!c && typeof c === "object" && typeof (c as Conversation).id === "string" && Array.isArray((c as Conversation).messages));
  } catch {
    return []; // a corrupt entry must not break the page
  }
}

export function saveConversations(storage: KeyValueStorage | undefined, conversations: Conversation[]): void {
  if (!storage) return;
  const kept = [...conversations].sort((a, b) => b.updatedAt - a.updatedAt).slice(0, MAX_CONVERSATIONS);
  try {
    storage.setItem(STORAGE_KEY, JSON.stringify(kept));
  } catch {
    // quota exceeded: keep the conversations in memory for this tab
  }
}
