/** UI state that outlives a page: route, theme, the open node panel, toasts. */

import { createStore, useStore } from "./store";

export type Page = "topology" | "models" | "chat" | "instances" | "observe" | "integrations" | "keys" | "settings";
export type Theme = "light" | "dark";
export const PAGES: Page[] = ["topology", "models", "chat", "instances", "observe", "integrations", "keys", "settings"];

export interface Toast {
  id: number;
  kind: "info" | "error";
  text: string;
}

export interface UiStore {
  page: Page;
  theme: Theme;
  nodePanel: string | null;
  toasts: Toast[];
}

/** `/ui/models` -> "models"; `/` and anything unknown -> "topology". */
export function pageFromPath(path: string): Page {
  const match = /^\/ui\/([a-z]+)/.exec(path);
  const name = match?.[1] as Page | undefined;
  return name && PAGES.includes(name) ? name : "topology";
}

function initialTheme(): Theme {
  const set = typeof document !== "undefined" ? document.documentElement.dataset.theme : undefined;
  return set === "dark" ? "dark" : "light";
}

export const ui = createStore<UiStore>({
  page: typeof location !== "undefined" ? pageFromPath(location.pathname) : "topology",
  theme: initialTheme(),
  nodePanel: null,
  toasts: [],
});

export function navigate(page: Page): void {
  if (typeof history !== "undefined") history.pushState({}, "", `/ui/${page}`);
  ui.set({ page });
}

export function setTheme(theme: Theme): void {
  document.documentElement.dataset.theme = theme;
  try {
    localStorage.setItem("skulk.theme", theme);
  } catch {
    // private mode: the theme lasts for this tab
  }
  ui.set({ theme });
}

let toastId = 0;
export function toast(text: string, kind: Toast["kind"] = "info"): void {
  const id = ++toastId;
  ui.set((s) => ({ toasts: [...s.toasts, { id, kind, text }].slice(-4) }));
  setTimeout(() => ui.set((s) => ({ toasts: s.toasts.filter((t) => t.id !== id) })), kind === "error" ? 8000 : 4000);
}

export const usePage = () => useStore(ui, (s) => s.page);
export const useTheme = () => useStore(ui, (s) => s.theme);
export const useNodePanel = () => useStore(ui, (s) => s.nodePanel);
export const useToasts = () => useStore(ui, (s) => s.toasts);
