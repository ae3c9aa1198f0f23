/**
 * Who the dashboard is to the node: no key on loopback, an API key from any other host.
 *
 * The key lives in this tab's sessionStorage only (gone when the browser session ends, never in
 * localStorage or a cookie), and is sent as `Authorization: Bearer` on every call, the state
 * stream included (read with fetch, because EventSource cannot set headers: a key in a URL would
 * land in access logs). A link printed by `skulk-kernel keys create` carries the key in the URL
 * fragment (`#key=`), which browsers never send to a server; it is moved to sessionStorage and
 * dropped from the address bar at once.
 *
 * Any 401 on the way (a wrong key, a revoked one) signs out with the node's reason: the app then
 * shows the sign-in page instead of a dashboard whose every call fails.
 */

import { createStore, useStore } from "./store";

export type Scope = "operator" | "inference";
export type SessionStatus = "checking" | "signed-in" | "needs-key";

export interface SessionStore {
  status: SessionStatus;
  scope: Scope | null;
  /** "key" (signed in with an API key), "loopback" or "open" (the node asks no key of this browser) */
  via: string | null;
  keyName: string | null;
  keyId: string | null;
  /** why the last key was refused, shown on the sign-in page */
  error: string | null;
}

const STORAGE = "skulk.apiKey";

export const session = createStore<SessionStore>({
  status: "checking", scope: null, via: null, keyName: null, keyId: null, error: null,
});

function storage(): Storage | null {
  try {
    return typeof sessionStorage !== "undefined" ? sessionStorage : null;
  } catch {
    return null;
  }
}

export function storedKey(): string | null {
  return storage()?.getItem(STORAGE) ?? null;
}

/** Headers every call adds: the key when there is one. */
export function authHeaders(): Record<string, string> {
  const key = storedKey();
  return key ? { authorization: `Bearer ${key}` } : {};
}

/** A `#key=...` fragment (from `skulk-kernel keys create`): taken out of the address bar, returned. */
export function takeKeyFromFragment(): string | null {
  if (typeof location === "undefined" || !location.hash.includes("key=")) return null;
  const params = new URLSearchParams(location.hash.slice(1));
  const key = params.get("key");
  params.delete("key");
  const rest = params.toString();
  history.replaceState(history.state, "", `${location.pathname}${location.search}${rest ? `#${rest}` : ""}`);
  return key && key.trim() ? key.trim() : null;
}

interface WhoAmI {
  scope: Scope;
  via: string;
  keyId: string | null;
  name: string | null;
}

async function whoami(key: string | null): Promise<{ ok: true; who: WhoAmI } | { ok: false; status: number; message: string }> {
  const response = await fetch("/v1/whoami", { headers: key ? { authorization: `Bearer ${key}` } : {} });
  if (response.ok) return { ok: true, who: (await response.json()) as WhoAmI };
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = (await response.json()) as { error?: { message?: string } | string };
    message = typeof body.error === "string" ? body.error : body.error?.message ?? message;
  } catch {
    // keep the status line
  }
  return { ok: false, status: response.status, message };
}

/**
 * Ask the node who `key` (or no key) is. Signed in: the key is kept for this tab. Refused: the
 * sign-in page shows why. Returns whether the dashboard may proceed.
 */
export async function signIn(key: string | null): Promise<boolean> {
  session.set({ status: "checking" });
  try {
    const answer = await whoami(key);
    if (answer.ok) {
      if (key) storage()?.setItem(STORAGE, key);
      const { who } = answer;
      session.set({ status: "signed-in", scope: who.scope, via: who.via, keyName: who.name, keyId: who.keyId, error: null });
      return true;
    }
    storage()?.removeItem(STORAGE);
    const error = !key
      ? null // no key yet: just ask for one
      : answer.status === 401
        ? `This key was refused: it is unknown or has been revoked (${answer.message}).`
        : answer.message;
    session.set({ status: "needs-key", scope: null, via: null, keyName: null, keyId: null, error });
    return false;
  } catch (exc) {
    if (!key) throw exc; // the first check without a key: startSession retries until the node answers
    session.set({ status: "needs-key", error: `The node did not answer: ${exc instanceof Error ? exc.message : String(exc)}` });
    return false;
  }
}

/** The first check: a key from the link's fragment, else this tab's stored key, else none. */
let started: Promise<boolean> | null = null;
export function startSession(): Promise<boolean> {
  started ??= (async () => { // once per page (StrictMode runs effects twice)
    const key = takeKeyFromFragment() ?? storedKey();
    for (;;) {
      try {
        return await signIn(key);
      } catch {
        await new Promise((resolve) => setTimeout(resolve, 1000)); // the node is (re)starting
      }
    }
  })();
  return started;
}

/** A call was refused with 401: the key is wrong or was revoked; back to the sign-in page. */
export function signedOut(reason: string): void {
  if (session.get().status !== "signed-in") return;
  storage()?.removeItem(STORAGE);
  session.set({
    status: "needs-key", scope: null, via: null, keyName: null, keyId: null,
    error: `Signed out: the node refused this key (${reason}). It may have been revoked; sign in with a valid key.`,
  });
}

export function signOut(): void {
  storage()?.removeItem(STORAGE);
  session.set({ status: "needs-key", scope: null, via: null, keyName: null, keyId: null, error: null });
}

export const useSession = () => useStore(session, (s) => s);
export const useCanOperate = () => useStore(session, (s) => s.scope === "operator");
