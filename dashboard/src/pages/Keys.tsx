/**
 * API keys (operator scope): create one (shown once, with copy and a sign-in link that carries the
 * key in the URL fragment, as `skulk-kernel keys create` prints), list them with this minute's use
 * against their quota, revoke. Keys are replicated State: in force on every node once applied.
 */

import { useCallback, useEffect, useState, type FormEvent } from "react";
import { api, ApiError } from "../api/client";
import type { ApiKey } from "../api/types";
import { Empty } from "../components/ui";
import { useCanOperate } from "../store/session";
import { toast } from "../store/ui";
import { copyText } from "./Integrations";

export function signInLink(origin: string, key: string): string {
  return `${origin.replace(/\/$/, "")}/ui/#key=${encodeURIComponent(key)}`;
}

export function Keys() {
  const canOperate = useCanOperate();
  const [keys, setKeys] = useState<ApiKey[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [name, setName] = useState("");
  const [scope, setScope] = useState<"inference" | "operator">("inference");
  const [quota, setQuota] = useState("");
  const [created, setCreated] = useState<{ id: string; name: string; key: string } | null>(null);
  const [busy, setBusy] = useState<string | null>(null);

  const load = useCallback(async () => {
    try {
      setKeys(await api.keys());
      setError(null);
    } catch (exc) {
      setError(exc instanceof Error ? exc.message : String(exc));
    }
  }, []);
  useEffect(() => {
    if (!canOperate) return;
    void load();
    const timer = setInterval(() => void load(), 5000); // use in the last minute moves on its own
    return () => clearInterval(timer);
  }, [canOperate, load]);

  if (!canOperate) {
    return (
      <>
        <div className="page-head"><h1>API keys</h1></div>
        <div className="card" data-testid="operator-only"><Empty title="Operator scope needed">Keys are managed with an operator key.</Empty></div>
      </>
    );
  }

  const create = async (e: FormEvent) => {
    e.preventDefault();
    setBusy("create");
    try {
      const tokens = quota.trim() ? Number(quota) : undefined;
      const answer = await api.createKey({ name: name.trim(), scope, ...(tokens ? { tokens_per_min: tokens } : {}) });
      setCreated({ id: answer.id, name: answer.name, key: answer.key });
      setName("");
      setQuota("");
      await load();
    } catch (exc) {
      toast(exc instanceof ApiError ? exc.message : String(exc), "error");
    } finally {
      setBusy(null);
    }
  };

  const revoke = async (key: ApiKey) => {
    if (!window.confirm(`Revoke the key ${key.name} (${key.id})? Every client using it is refused from now on.`)) return;
    setBusy(key.id);
    try {
      await api.revokeKey(key.id);
      toast(`Revoked ${key.name}`);
      if (created?.id === key.id) setCreated(null);
      await load();
    } catch (exc) {
      toast(exc instanceof ApiError ? exc.message : String(exc), "error");
    } finally {
      setBusy(null);
    }
  };

  const link = created ? signInLink(location.origin, created.key) : "";
  return (
    <>
      <div className="page-head"><h1>API keys</h1><span className="muted">{keys?.length ?? "…"} key{keys?.length === 1 ? "" : "s"} · cluster-wide</span></div>
      <div className="stack" style={{ gap: 14 }}>
        <form className="card stack" onSubmit={create} aria-label="Create an API key" data-testid="key-form">
          <h2>Create a key</h2>
          <div className="row wrap">
            <label className="field">Name
              <input className="input" required maxLength={64} value={name} onChange={(e) => setName(e.target.value)} placeholder="laptop" />
            </label>
            <label className="field">Scope
              <select className="select" value={scope} onChange={(e) => setScope(e.target.value as "inference" | "operator")}>
                <option value="inference">inference: the model APIs and viewing</option>
                <option value="operator">operator: everything</option>
              </select>
            </label>
            <label className="field">Tokens per minute (empty: no quota)
              <input className="input" type="number" min={1} inputMode="numeric" value={quota} onChange={(e) => setQuota(e.target.value)} />
            </label>
            <button className="btn primary" type="submit" disabled={busy === "create" || !name.trim()}>Create key</button>
          </div>
        </form>
        {created && (
          <div className="card stack" role="status" data-testid="created-key" data-key-id={created.id}>
            <h2>Key {created.name} created: copy it now, it is not shown again</h2>
            <div className="row wrap">
              <code className="code inline" data-testid="created-key-value">{created.key}</code>
              <button className="btn small" onClick={() => void copyText(created.key)}>Copy key</button>
            </div>
            <div className="row wrap">
              <span className="small muted">Sign-in link (the key rides in the fragment, which browsers never send to a server):</span>
              <a className="mono small" href={link} data-testid="sign-in-link">{link.replace(/#key=.*/, "#key=…")}</a>
              <button className="btn small" onClick={() => void copyText(link)}>Copy link</button>
            </div>
            <button className="btn small ghost" onClick={() => setCreated(null)}>I stored it: hide</button>
          </div>
        )}
        <div className="card stack">
          <h2>Keys</h2>
          {error && <div className="reason error small" role="alert">{error}</div>}
          {keys && keys.length === 0 ? <span className="muted small">No keys yet: browsers on other hosts cannot sign in.</span> : (
            <table className="table" data-testid="keys">
              <thead><tr><th scope="col">Name</th><th scope="col">Id</th><th scope="col">Scope</th><th scope="col">Use (last minute)</th><th scope="col">Created</th><th scope="col"><span className="sr-only">Actions</span></th></tr></thead>
              <tbody>{(keys ?? []).map((k) => (
                <tr key={k.id} data-testid="key-row" data-key-id={k.id}>
                  <td>{k.name}</td>
                  <td className="mono small">{k.id}</td>
                  <td><span className="chip">{k.scope}</span></td>
                  <td className="small">{k.tokens_last_minute.toLocaleString("en-US")} tokens{k.tokens_per_min ? ` of ${k.tokens_per_min.toLocaleString("en-US")}/min` : " (no quota)"}</td>
                  <td className="small">{new Date(k.created_at * 1000).toLocaleString()}</td>
                  <td><button className="btn small danger" aria-label={`Revoke ${k.name}`} disabled={busy === k.id} onClick={() => void revoke(k)}>Revoke</button></td>
                </tr>
              ))}</tbody>
            </table>
          )}
        </div>
      </div>
    </>
  );
}
