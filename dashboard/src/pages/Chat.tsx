/** Chat with any ready model; reasoning and tool calls shown apart; conversations kept in the browser. */

import { useEffect, useMemo, useRef, useState, type ClipboardEvent, type KeyboardEvent } from "react";
import type { StateMessage } from "../api/types";
import { Empty, Icon } from "../components/ui";
import { prettyArguments, type ChatMessage } from "../logic/chat";
import { chatModels } from "../logic/derive";
import { hasVision, IMAGE_MAX_BYTES, imageProblem, readImage, type ChatImage } from "../logic/images";
import { modelName } from "../logic/format";
import {
  deleteConversation, newConversation, selectConversation, send, setModel, stop, useChat,
} from "../store/chat";
import { useCatalog } from "../store/cluster";
import { STEWARD_MODEL, StewardProposals, useSteward } from "./Steward";
import { MicButton, readyModelWith, SpeakButton } from "./Voice";

function Message({ m, live, steward, tts }: { m: ChatMessage; live: boolean; steward?: boolean; tts?: string | null }) {
  if (m.role === "user") {
    return (
      <div className="msg user" data-testid="user-message">
        {m.images?.length ? (
          <div className="thumbs">{m.images.map((url, i) => <img key={i} src={url} alt={`image ${i + 1} sent`} data-testid="sent-image" />)}</div>
        ) : null}
        {m.content}
      </div>
    );
  }
  const empty = !m.content && !m.reasoning && !m.toolCalls?.length;
  return (
    <div className="msg assistant" data-testid="assistant-message" data-streaming={live}>
      {m.reasoning && (
        <details className="thinking" open={live} data-testid="reasoning">
          <summary>{steward ? "Steward's tool steps" : "Reasoning"}</summary>
          {m.reasoning}
        </details>
      )}
      <span className={live ? "cursor" : ""} data-testid="assistant-text">{m.content}</span>
      {empty && !live && !m.error && <span className="muted">(no answer)</span>}
      {m.toolCalls?.map((call) => (
        <div className="toolcall" key={call.index} data-testid="tool-call">
          <header><Icon name="tool" />{call.name}<span className="muted mono small">{call.id}</span></header>
          <pre>{prettyArguments(call.arguments)}</pre>
        </div>
      ))}
      {m.error && <div className="reason error small" style={{ marginTop: 8 }}>{m.error}</div>}
      {tts && !live && m.content.trim() && <div><SpeakButton model={tts} text={m.content} /></div>}
      {(m.stopped || m.finishReason || m.stats) && (
        <div className="meta" data-testid="message-meta">
          {m.stopped ? "stopped" : m.finishReason ? `finished: ${m.finishReason}` : ""}
          {m.stats?.generation_tokens != null ? ` · ${m.stats.generation_tokens} tokens` : ""}
          {m.stats?.generation_tps ? ` · ${m.stats.generation_tps.toFixed(1)} tok/s` : ""}
        </div>
      )}
    </div>
  );
}

export function Chat({ msg }: { msg: StateMessage }) {
  const catalog = useCatalog();
  const conversations = useChat((s) => s.conversations);
  const activeId = useChat((s) => s.activeId);
  const model = useChat((s) => s.model);
  const streaming = useChat((s) => s.streaming);
  const [text, setText] = useState("");
  const [images, setImages] = useState<ChatImage[]>([]);
  const [imageError, setImageError] = useState<string | null>(null);
  const picker = useRef<HTMLInputElement>(null);
  const bottom = useRef<HTMLDivElement>(null);
  const embedding = useMemo(() => new Set(catalog.filter((m) => !m.tasks.includes("TextGeneration") && m.tasks.length).map((m) => m.id)), [catalog]);
  const steward = useSteward();
  const tts = readyModelWith(msg.state, catalog, "SpeechSynthesis");
  const stt = readyModelWith(msg.state, catalog, "Transcription");
  const hasSteward = steward !== null;
  const models = useMemo(() => [...chatModels(msg.state, embedding), ...(hasSteward ? [STEWARD_MODEL] : [])], [msg, embedding, hasSteward]);
  const active = conversations.find((c) => c.id === activeId);
  const vision = hasVision(catalog.find((c) => c.id === model)?.capabilities);
  useEffect(() => { if (!vision) setImages([]); }, [vision]);
  const attach = async (files: File[]) => {
    if (!vision) {
      if (files.length) setImageError(`${modelName(model)} does not take images (it has no vision capability)`);
      return;
    }
    const taken: ChatImage[] = [];
    for (const file of files) {
      const problem = imageProblem(file, images.length + taken.length);
      if (problem) { setImageError(problem); continue; }
      try { taken.push(await readImage(file)); } catch (exc) { setImageError(String(exc)); }
    }
    if (taken.length) { setImageError(null); setImages((had) => [...had, ...taken]); }
  };
  const onPaste = (e: ClipboardEvent<HTMLTextAreaElement>) => {
    const files = [...e.clipboardData.files].filter((f) => f.type.startsWith("image/"));
    if (!files.length) return;
    e.preventDefault();
    void attach(files);
  };
  useEffect(() => {
    if (!models.includes(model) && models[0] && !streaming) setModel(active && models.includes(active.model) ? active.model : models[0]);
  }, [models, model, streaming, active]);
  useEffect(() => { bottom.current?.scrollIntoView({ block: "end" }); }, [active?.messages]);
  const submit = () => {
    if ((!text.trim() && !images.length) || streaming || !model) return;
    void send(text, images.map((i) => i.url));
    setText("");
    setImages([]);
    setImageError(null);
  };
  const onKey = (e: KeyboardEvent<HTMLTextAreaElement>) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      submit();
    }
  };
  const sorted = [...conversations].sort((a, b) => b.updatedAt - a.updatedAt);
  return (
    <>
      <div className="page-head">
        <h1>Chat</h1>
        <span className="spacer" />
        <select className="select" aria-label="Select chat model" value={model} onChange={(e) => setModel(e.target.value)} disabled={!models.length}>
          {models.length === 0 && <option value="">no ready model</option>}
          {models.map((m) => <option key={m} value={m}>{m === STEWARD_MODEL ? "Steward (knows the cluster)" : modelName(m)}</option>)}
        </select>
      </div>
      {steward && steward.proposals.length > 0 && <div style={{ marginBottom: 14 }}><StewardProposals steward={steward} /></div>}
      <div className="chat">
        <div className="card convs">
          <button className="btn" onClick={newConversation}><Icon name="plus" />New chat</button>
          {sorted.map((c) => (
            <div key={c.id} className={`conv ${c.id === activeId ? "active" : ""}`} onClick={() => selectConversation(c.id)}>
              <button className="conv-open" title={c.title} aria-current={c.id === activeId ? "true" : undefined}
                onClick={(e) => { e.stopPropagation(); selectConversation(c.id); }}><span>{c.title}</span></button>
              <button className="btn ghost small" aria-label={`Delete conversation ${c.title}`} onClick={(e) => { e.stopPropagation(); deleteConversation(c.id); }}><Icon name="trash" /></button>
            </div>
          ))}
        </div>
        <div className="card thread">
          <div className="messages" aria-live="polite">
            {!active || active.messages.length === 0 ? (
              <Empty title={models.length ? `Chat with ${modelName(model)}` : "No model is ready"}>
                {models.length ? "Answers stream from the cluster; conversations stay in this browser." : "Launch a model from the Models page first."}
              </Empty>
            ) : active.messages.map((m, i) => (
              <Message key={i} m={m} tts={tts} steward={active.model === STEWARD_MODEL} live={streaming && i === active.messages.length - 1 && m.role === "assistant"} />
            ))}
            <div ref={bottom} />
          </div>
          {(images.length > 0 || imageError || vision) && (
            <div className="attachments" data-testid="attachments">
              {images.map((img, i) => (
                <span className="thumb" key={i}>
                  <img src={img.url} alt={`attached image ${img.name}`} data-testid="attached-image" />
                  <button className="btn ghost small" aria-label={`Remove image ${img.name}`} onClick={() => setImages((had) => had.filter((_, j) => j !== i))}><Icon name="trash" /></button>
                </span>
              ))}
              {vision && <span className="muted small">Paste or attach images (PNG, JPEG, WebP, GIF; up to {IMAGE_MAX_BYTES / (1024 * 1024)} MiB each).</span>}
              {imageError && <span className="reason error small" role="alert" data-testid="image-error">{imageError}</span>}
            </div>
          )}
          <div className="composer">
            <textarea className="textarea" rows={2} aria-label="Chat message" placeholder={model ? `Message ${modelName(model)}` : "No model is ready"}
              value={text} onChange={(e) => setText(e.target.value)} onKeyDown={onKey} onPaste={onPaste} />
            {vision && !streaming && (
              <>
                <input ref={picker} type="file" accept="image/*" multiple hidden data-testid="image-input" aria-label="Attach images"
                  onChange={(e) => { void attach([...(e.target.files ?? [])]); e.target.value = ""; }} />
                <button className="btn" data-testid="attach-image" onClick={() => picker.current?.click()}><Icon name="plus" />Attach images</button>
              </>
            )}
            {stt && !streaming && <MicButton model={stt} onText={(heard) => setText((t) => (t.trim() ? `${t.trim()} ${heard}` : heard))} />}
            {streaming ? (
              <button className="btn danger" aria-label="Stop" onClick={stop}><Icon name="stop" />Stop</button>
            ) : (
              <button className="btn primary" aria-label="Send message" onClick={submit} disabled={(!text.trim() && !images.length) || !model}><Icon name="send" />Send</button>
            )}
          </div>
        </div>
      </div>
    </>
  );
}
