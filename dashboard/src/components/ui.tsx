/** Small shared pieces: icons, badges, bars, empty states. Colours come only from theme tokens. */

import type { ReactNode } from "react";
import type { Level } from "../logic/derive";
import { percent } from "../logic/format";

const PATHS: Record<string, string> = {
  topology: "M5 6a2 2 0 1 0 0 .01M19 6a2 2 0 1 0 0 .01M12 18a2 2 0 1 0 0 .01M6.5 7.5l4.3 8.8M17.5 7.5l-4.3 8.8M7 6h10",
  models: "M4 7l8-4 8 4-8 4-8-4zm0 5l8 4 8-4M4 17l8 4 8-4",
  chat: "M4 5h16v11H8l-4 4V5z",
  instances: "M4 4h16v6H4zM4 14h16v6H4zM8 7h.01M8 17h.01",
  observe: "M3 12h4l3-7 4 14 3-7h4",
  integrations: "M9 7 4 12l5 5M15 7l5 5-5 5",
  keys: "M14 10a4 4 0 1 0-3.5 4l1.5-1.5h2v-2h2l2-2-1.5-1.5",
  settings: "M12 9a3 3 0 1 0 0 6 3 3 0 0 0 0-6zM12 2v3M12 19v3M2 12h3M19 12h3M4.9 4.9l2.1 2.1M17 17l2.1 2.1M4.9 19.1 7 17M17 7l2.1-2.1",
  mic: "M12 3a3 3 0 0 0-3 3v6a3 3 0 0 0 6 0V6a3 3 0 0 0-3-3zM5 11a7 7 0 0 0 14 0M12 18v3",
  sun: "M12 4V2M12 22v-2M4 12H2M22 12h-2M5.6 5.6 4.2 4.2M19.8 19.8l-1.4-1.4M5.6 18.4l-1.4 1.4M19.8 4.2l-1.4 1.4M12 8a4 4 0 1 0 0 8 4 4 0 0 0 0-8z",
  moon: "M20 14.5A8 8 0 0 1 9.5 4 8 8 0 1 0 20 14.5z",
  search: "M11 4a7 7 0 1 0 0 14 7 7 0 0 0 0-14zM21 21l-5-5",
  send: "M4 12l16-8-6 16-2-6-8-2z",
  stop: "M7 7h10v10H7z",
  plus: "M12 5v14M5 12h14",
  trash: "M5 7h14M10 7V4h4v3M7 7l1 13h8l1-13",
  close: "M6 6l12 12M18 6L6 18",
  tool: "M14 6a4 4 0 0 0 5 5l-8 8-3-3 8-8a4 4 0 0 0-2-2z",
};

export function Icon({ name }: { name: keyof typeof PATHS | string }) {
  return (
    <svg viewBox="0 0 24 24" fill="none" stroke="currentColor" strokeWidth={1.8} strokeLinecap="round" strokeLinejoin="round" aria-hidden="true">
      <path d={PATHS[name] ?? ""} />
    </svg>
  );
}

export function HealthBadge({ level, label }: { level: Level; label?: string }) {
  return (
    <span className={`badge ${level}`} data-health={level}>
      <span className="dot" />
      {label ?? level}
    </span>
  );
}

export function Bar({ value, total, tone, label, indeterminate }: {
  value: number; total: number; tone?: "ok" | "info" | "error"; label: string; indeterminate?: boolean;
}) {
  const pct = percent(value, total);
  return (
    <div className={`bar ${tone ?? ""} ${indeterminate ? "indeterminate" : ""}`} role="progressbar"
      aria-label={label} aria-valuemin={0} aria-valuemax={100} aria-valuenow={Math.round(pct)}>
      <span style={{ width: `${pct}%` }} />
    </div>
  );
}

export function Empty({ title, children }: { title: string; children?: ReactNode }) {
  return (
    <div className="empty">
      <strong>{title}</strong>
      {children}
    </div>
  );
}

const PHASE_TONE: Record<string, string> = { ready: "ok", loading: "info", starting: "info", failed: "error", stopping: "warn" };

export function PhaseBadge({ phase }: { phase: string }) {
  return (
    <span className={`badge ${PHASE_TONE[phase] ?? ""}`} data-phase={phase}>
      <span className={`dot ${phase === "loading" || phase === "starting" ? "pulse" : ""}`} />
      {phase}
    </span>
  );
}

/** A stable colour per instance, from the theme's series tokens. */
export function seriesColor(index: number): string {
  return `var(--series-${(index % 6) + 1})`;
}

export function runnerTone(status: string): string {
  if (status === "RunnerReady" || status === "RunnerRunning") return "ok";
  if (status === "RunnerFailed") return "error";
  if (status.includes("Shut")) return "warn";
  return "info";
}

export function statusName(status: string): string {
  return status.replace(/^Runner/, "").replace(/([a-z])([A-Z])/g, "$1 $2").toLowerCase();
}
