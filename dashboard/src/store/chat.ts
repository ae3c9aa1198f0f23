/**
 * Conversations and the one generation in flight.
 *
 * A generation is a `fetch` of `/v1/chat/completions` with `stream: true`, read through
 * `SseParser`. Stop aborts the fetch (the node cancels a request whose client went away) and also
 * asks `POST /v1/cancel/{command_id}`, so the runner stops even behind a proxy that keeps the
 * upstream connection open.
 */

import { api, errorFrom } from "../api/client";
import {
  applyChunk, loadConversations, requestMessages, saveConversations, titleFor,
  type ChatChunk, type ChatMessage, type Conversation,
} from "../logic/chat";
import { SseParser } from "../logic/sse";
import { authHeaders } from "./session";
import { createStore, useStore } from "./store";

export interface ChatStore {
  conversations: Conversation[];
  activeId: string | null;
  model: string;
  streaming: boolean;
}

const storage = typeof localStorage !== "undefined" ? localStorage : undefined;
const saved = loadConversations(storage);

export const chat = createStore<ChatStore>({
  conversations: saved,
  activeId: saved.sort((a, b) => b.updatedAt - a.updatedAt)[0]?.id ?? null,
  model: "",
  streaming: false,
});

chat.subscribe(() => {
  if (!chat.get().streaming) saveConversations(storage, chat.get().conversations); // once per finished turn
});

let inflight: { abort: AbortController; commandId: string | null } | null = null;

function newId(): string {
  return typeof crypto !== "undefined" && "randomUUID" in crypto ? crypto.randomUUID() : `${Date.now()}-${Math.random()}`;
}

function update(id: string, change: (c: Conversation) => Conversation): void {
  chat.set((s) => ({ conversations: s.conversations.map((c) => (c.id === id ? change(c) : c)) }));
}

function updateLast(id: string, change: (m: ChatMessage) => ChatMessage): void {
  update(id, (c) => ({ ...c, updatedAt: Date.now(), messages: [...c.messages.slice(0, -1), change(c.messages.at(-1)!)] }));
}

export function newConversation(): void {
  chat.set({ activeId: null });
}

export function selectConversation(id: string): void {
  chat.set({ activeId: id });
}

export function deleteConversation(id: string): void {
  chat.set((s) => ({ conversations: s.conversations.filter((c) => c.id !== id), activeId: s.activeId === id ? null : s.activeId }));
}

export function setModel(model: string): void {
  chat.set({ model });
}

export async function send(text: string, images: string[] = []): Promise<void> {
  const state = chat.get();
  if (state.streaming || (!text.trim() && !images.length) || !state.model) return;
  let id = state.activeId;
  if (!id || !state.conversations.some((c) => c.id === id)) {
    id = newId();
    const fresh: Conversation = { id, title: titleFor(text || "Image"), model: state.model, messages: [], updatedAt: Date.now() };
    chat.set((s) => ({ conversations: [fresh, ...s.conversations], activeId: id }));
  }
  const convId = id;
  const history = chat.get().conversations.find((c) => c.id === convId)!.messages;
  const turn: ChatMessage = images.length ? { role: "user", content: text, images } : { role: "user", content: text };
  const messages = requestMessages([...history, turn]);
  update(convId, (c) => ({
    ...c, model: state.model, updatedAt: Date.now(),
    messages: [...c.messages, turn, { role: "assistant", content: "" }],
  }));
  const abort = new AbortController();
  inflight = { abort, commandId: null };
  chat.set({ streaming: true });
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", signal: abort.signal, headers: { "content-type": "application/json", ...authHeaders() },
      body: JSON.stringify({ model: state.model, stream: true, messages }),
    });
    if (!response.ok || !response.body) throw await errorFrom(response);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new SseParser();
    for (;;) {
      const { value, done } = await reader.read();
      const out = done ? parser.end() : parser.feed(value);
      for (const comment of out.comments) {
        if (comment.startsWith("command_id ") && inflight) inflight.commandId = comment.slice(11).trim();
        if (comment.startsWith("generation_stats ")) {
          try {
            const stats = JSON.parse(comment.slice(17)) as ChatMessage["stats"];
            updateLast(convId, (m) => ({ ...m, stats }));
          } catch {
            // a stats line is informational
          }
        }
      }
      for (const event of out.events) {
        if (event.data === "[DONE]") continue;
        try {
          const parsed = JSON.parse(event.data) as ChatChunk;
          updateLast(convId, (m) => applyChunk(m, parsed));
        } catch {
          // a non-JSON data line: skip it
        }
      }
      if (done) break;
    }
  } catch (exc) {
    if (abort.signal.aborted) updateLast(convId, (m) => ({ ...m, stopped: true }));
    else updateLast(convId, (m) => ({ ...m, error: exc instanceof Error ? exc.message : String(exc) }));
  } finally {
    inflight = null;
    chat.set({ streaming: false });
  }
}

export function stop(): void {
  const current = inflight;
  if (!current) return;
  if (current.commandId) void api.cancel(current.commandId).catch(() => undefined);
  current.abort.abort();
}

export const useChat = <S,>(select: (s: ChatStore) => S) => useStore(chat, select);
