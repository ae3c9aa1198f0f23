/** Number and time formatting shared by every page (binary units, as the node's messages use). */

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

export function formatBytes(bytes: number | null | undefined): string {
  if (bytes == null || !Number.isFinite(bytes)) return "–";
  let value = Math.abs(bytes);
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit++;
  }
  const digits = unit === 0 ? 0 : value < 10 ? 2 : value < 100 ? 1 : 0;
  return `${bytes < 0 ? "-" : ""}${value.toFixed(digits)} ${UNITS[unit]}`;
}

export function percent(part: number, whole: number): number {
  if (!whole || whole <= 0) return 0;
  return Math.max(0, Math.min(100, (part / whole) * 100));
}

export function formatPercent(part: number, whole: number): string {
  return `${Math.round(percent(part, whole))}%`;
}

export function formatAge(seconds: number | null | undefined): string {
  if (seconds == null) return "never";
  if (seconds < 1) return "just now";
  if (seconds < 60) return `${Math.round(seconds)} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  return `${Math.round(seconds / 3600)} h ago`;
}

export function formatTime(iso: string): string {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : date.toLocaleString();
}

export function shortId(id: string): string {
  return id.length > 12 ? id.slice(0, 8) : id;
}

/** `HuggingFaceTB/SmolLM2-135M-Instruct` -> `SmolLM2-135M-Instruct`. */
export function modelName(modelId: string): string {
  return modelId.split("/").pop() || modelId;
}
