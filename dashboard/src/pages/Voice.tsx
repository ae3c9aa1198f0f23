/**
 * Speech in Chat, when the cluster has speech models with a ready instance: an answer read aloud
 * (`POST /v1/audio/speech`, WAV, played in the page) and a microphone whose recording becomes the
 * prompt (`POST /v1/audio/transcriptions`). The microphone is read as raw samples (Web Audio) and
 * sent as WAV, which every speech engine reads, rather than the browser's own compressed format.
 */

import { useRef, useState } from "react";
import type { CatalogModel, ClusterState } from "../api/types";
import { errorFrom } from "../api/client";
import { Icon } from "../components/ui";
import { instanceViews } from "../logic/derive";
import { encodeWav } from "../logic/wav";
import { authHeaders } from "../store/session";
import { toast } from "../store/ui";

/** The first model with a ready instance whose catalog card has `task`. */
export function readyModelWith(state: ClusterState, catalog: readonly CatalogModel[], task: string): string | null {
  const ready = new Set(instanceViews(state).filter((v) => v.phase === "ready").map((v) => v.modelId));
  return catalog.find((m) => ready.has(m.id) && m.tasks.includes(task))?.id ?? null;
}

export function SpeakButton({ model, text }: { model: string; text: string }) {
  const [state, setState] = useState<"idle" | "loading" | "playing">("idle");
  const speak = async () => {
    setState("loading");
    try {
      const response = await fetch("/v1/audio/speech", {
        method: "POST",
        headers: { "content-type": "application/json", ...authHeaders() },
        body: JSON.stringify({ model, input: text, response_format: "wav" }),
      });
      if (!response.ok) throw await errorFrom(response);
      const url = URL.createObjectURL(await response.blob());
      const audio = new Audio(url);
      audio.dataset.testid = "speech-audio";
      audio.onended = () => { setState("idle"); URL.revokeObjectURL(url); document.body.dataset.spokenAt = String(Date.now()); };
      setState("playing");
      await audio.play();
    } catch (exc) {
      setState("idle");
      toast(exc instanceof Error ? exc.message : String(exc), "error");
    }
  };
  return (
    <button className="btn ghost small" onClick={() => void speak()} disabled={state !== "idle"} data-testid="speak" data-state={state}
      title="Read this answer aloud">{state === "loading" ? "Preparing audio…" : state === "playing" ? "Speaking…" : "Speak"}</button>
  );
}

interface Recording { stop: () => Promise<Float32Array>; rate: number }

async function startRecording(): Promise<Recording> {
  const stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false } });
  const context = new AudioContext();
  const source = context.createMediaStreamSource(stream);
  const processor = context.createScriptProcessor(4096, 1, 1);
  const chunks: Float32Array[] = [];
  processor.onaudioprocess = (e) => chunks.push(new Float32Array(e.inputBuffer.getChannelData(0)));
  source.connect(processor);
  processor.connect(context.destination);
  return {
    rate: context.sampleRate,
    stop: async () => {
      processor.disconnect();
      source.disconnect();
      stream.getTracks().forEach((t) => t.stop());
      await context.close();
      const out = new Float32Array(chunks.reduce((n, c) => n + c.length, 0));
      let at = 0;
      for (const c of chunks) { out.set(c, at); at += c.length; }
      return out;
    },
  };
}

export function MicButton({ model, onText }: { model: string; onText: (text: string) => void }) {
  const recording = useRef<Recording | null>(null);
  const [state, setState] = useState<"idle" | "recording" | "transcribing">("idle");
  const toggle = async () => {
    if (state === "idle") {
      try {
        recording.current = await startRecording();
        setState("recording");
      } catch (exc) {
        toast(`The microphone is not available: ${exc instanceof Error ? exc.message : String(exc)}`, "error");
      }
      return;
    }
    if (state !== "recording" || !recording.current) return;
    setState("transcribing");
    try {
      const { rate } = recording.current;
      const samples = await recording.current.stop();
      const form = new FormData();
      form.append("model", model);
      form.append("file", new Blob([encodeWav(samples, rate)], { type: "audio/wav" }), "microphone.wav");
      const response = await fetch("/v1/audio/transcriptions", { method: "POST", headers: authHeaders(), body: form });
      if (!response.ok) throw await errorFrom(response);
      const text = ((await response.json()) as { text?: string }).text?.trim() ?? "";
      if (text) onText(text);
      else toast("Nothing was heard", "error");
    } catch (exc) {
      toast(exc instanceof Error ? exc.message : String(exc), "error");
    } finally {
      recording.current = null;
      setState("idle");
    }
  };
  return (
    <button className={`btn ${state === "recording" ? "danger" : ""}`} onClick={() => void toggle()} disabled={state === "transcribing"}
      data-testid="mic" data-state={state} aria-pressed={state === "recording"}
      aria-label={state === "recording" ? "Stop recording and transcribe" : "Speak a prompt"}>
      <Icon name="mic" />{state === "recording" ? "Stop" : state === "transcribing" ? "…" : ""}
    </button>
  );
}
