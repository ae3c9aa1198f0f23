/**
 * The cluster configuration (`GET/PUT /config`) as a form. Settings here are cluster-wide: a PUT on
 * any node becomes replicated State, in force on every node once applied. What is per node lives in
 * each node's profile (`[plugins.*]` in its TOML) and is said so here, not offered. Validation is
 * the node's own: a 400 names the setting and what to fix, and the page shows it beside the field.
 */

import { Fragment, useCallback, useEffect, useState, type FormEvent } from "react";
import { ApiError, request } from "../api/client";
import { Empty } from "../components/ui";
import { useCanOperate } from "../store/session";
import { toast } from "../store/ui";

interface ConfigView {
  settings: Record<string, unknown>;
  updated: Record<string, { setBy?: string; at?: number }>;
  nodeId: string;
}

const LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"];

/** The settings a node acts on, with what they do (the rest are stored for plugins that read them). */
const KNOWN: { name: string; label: string; acts: string; choices?: string[]; numeric?: boolean; secret?: boolean; group: string }[] = [
  { name: "default_context_tokens", label: "Default context (tokens)", numeric: true, group: "Placement defaults",
    acts: "a placement that names no context, asked of any node (capped to the model's own)" },
  { name: "default_kv_cache_type", label: "Default KV cache type", choices: ["f16", "q8_0", "q4_0"], group: "Placement defaults",
    acts: "a placement that names no KV cache type (q8_0/q4_0 need an engine that quantizes its KV cache)" },
  { name: "hub_endpoint", label: "Hub endpoint (URL)", group: "Downloads",
    acts: "every node's next hub search, add and download (over HF_ENDPOINT)" },
  { name: "hub_token", label: "Hub token", secret: true, group: "Downloads",
    acts: "every node's hub calls (over HF_TOKEN); sealed with the cluster secret: only nodes can read it, never shown again" },
  { name: "log_level", label: "Log level", choices: LOG_LEVELS, group: "Logging and tracing", acts: "every node's root logger, at once" },
  { name: "trace_ttl_s", label: "Trace retention (seconds)", numeric: true, group: "Logging and tracing", acts: "how long every node keeps a request's spans" },
];

export function Settings() {
  const canOperate = useCanOperate();
  const [view, setView] = useState<ConfigView | null>(null);
  const [draft, setDraft] = useState<Record<string, string>>({});
  const [errors, setErrors] = useState<Record<string, string>>({});
  const [other, setOther] = useState({ name: "", value: "" });
  const [busy, setBusy] = useState(false);
  const [loadError, setLoadError] = useState<string | null>(null);

  const load = useCallback(async () => {
    try {
      const v = await request<ConfigView>("/config");
      setView(v);
      setDraft(Object.fromEntries(KNOWN.map((k) => [k.name, k.secret || v.settings[k.name] == null ? "" : String(v.settings[k.name])])));
    } catch (exc) {
      setLoadError(exc instanceof ApiError && exc.status === 404
        ? "This node serves no /config: its profile lacks the observe plugin, which keeps the cluster settings."
        : exc instanceof Error ? exc.message : String(exc));
    }
  }, []);
  useEffect(() => { void load(); }, [load]);

  const put = async (body: Record<string, unknown>, field: string) => {
    setBusy(true);
    try {
      const v = await request<ConfigView>("/config", { method: "PUT", body: JSON.stringify(body) });
      setView(v);
      setErrors({});
      toast("Saved: in force on every node once applied");
    } catch (exc) {
      const text = exc instanceof ApiError ? exc.message : String(exc);
      setErrors({ [field]: text });
    } finally {
      setBusy(false);
    }
  };

  const saveKnown = (e: FormEvent) => {
    e.preventDefault();
    const body: Record<string, unknown> = {};
    for (const k of KNOWN) {
      const raw = (draft[k.name] ?? "").trim();
      if (k.secret) {
        if (raw) body[k.name] = raw; // never read back: an empty field leaves the stored one as it is
        continue;
      }
      const before = view?.settings[k.name];
      if (raw === (before == null ? "" : String(before))) continue;
      body[k.name] = raw === "" ? null : k.numeric && /^-?[0-9.]+$/.test(raw) ? Number(raw) : raw;
    }
    const first = Object.keys(body)[0];
    if (first) void put(body, first);
  };

  const saveOther = (e: FormEvent) => {
    e.preventDefault();
    let value: unknown = other.value;
    try {
      value = JSON.parse(other.value);
    } catch {
      // not JSON: a plain string
    }
    void put({ [other.name.trim()]: value === "" ? null : value }, "other");
  };

  if (!view) {
    return <><div className="page-head"><h1>Settings</h1></div>
      <div className="card">{loadError ? <div className="reason error" role="alert">{loadError}</div> : <Empty title="Loading…" />}</div></>;
  }
  const others = Object.entries(view.settings).filter(([name]) => !KNOWN.some((k) => k.name === name));
  return (
    <>
      <div className="page-head"><h1>Settings</h1><span className="muted">cluster-wide · replicated State</span></div>
      <div className="stack" style={{ gap: 14 }}>
        <div className="reason info small" role="note" data-testid="scope-note">
          Everything on this page is <strong>cluster-wide</strong>: saved on any node, it is in force on every node within
          a heartbeat. What is <strong>per node</strong> (its engines, threads, models folder, API address, whether loopback
          needs a key) is in that node's profile file (<code>[plugins.*]</code>) and changes with a restart of that node.
        </div>
        <form className="card stack" onSubmit={saveKnown} aria-label="Cluster settings" data-testid="settings-form">
          {KNOWN.map((k, i) => { const updated = view.updated[k.name]; return (
            <Fragment key={k.name}>
            {KNOWN[i - 1]?.group !== k.group && <h2>{k.group}</h2>}
            <label className="field">
              <span>{k.label} <span className="muted">· <code>{k.name}</code> · acts on {k.acts}</span></span>
              {k.choices ? (
                <select className="select" name={k.name} disabled={!canOperate} value={draft[k.name] ?? ""}
                  aria-invalid={Boolean(errors[k.name])} aria-describedby={errors[k.name] ? `${k.name}-error` : undefined}
                  onChange={(e) => setDraft({ ...draft, [k.name]: e.target.value })}>
                  <option value="">(default: the profile's)</option>
                  {k.choices.map((l) => <option key={l} value={l}>{l}</option>)}
                </select>
              ) : (
                <input className="input" name={k.name} disabled={!canOperate} value={draft[k.name] ?? ""}
                  type={k.secret ? "password" : "text"} autoComplete="off" inputMode={k.numeric ? "decimal" : undefined}
                  aria-invalid={Boolean(errors[k.name])} aria-describedby={errors[k.name] ? `${k.name}-error` : undefined}
                  placeholder={k.secret ? (view.settings[k.name] ? "(set: type a new one to replace it)" : "(not set)") : "(default: the profile's)"} onChange={(e) => setDraft({ ...draft, [k.name]: e.target.value })} />
              )}
              {errors[k.name] && <span id={`${k.name}-error`} className="reason error small" role="alert" data-testid="setting-error">{errors[k.name]}</span>}
              {updated && <span className="muted small">set by {updated.setBy?.slice(0, 8)} at {new Date((updated.at ?? 0) * 1000).toLocaleString()}</span>}
            </label>
            </Fragment>
          ); })}
          {canOperate ? <button className="btn primary" type="submit" disabled={busy}>Save</button>
            : <span className="muted small" data-testid="operator-only">Changing settings needs an operator key.</span>}
        </form>
        <section className="card stack" aria-label="Other settings">
          <h2>Other settings</h2>
          <span className="muted small">Stored for the plugins that read them. Names ending in <code>_token</code>, <code>_secret</code>,
            {" "}<code>_password</code> or <code>_api_key</code> are kept only as a digest (never readable back).
            The hub token above is the exception: a node must send it, so it is sealed with the cluster secret instead.</span>
          {others.length === 0 ? <span className="muted small">None.</span> : (
            <table className="table" data-testid="other-settings">
              <thead><tr><th scope="col">Name</th><th scope="col">Value</th></tr></thead>
              <tbody>{others.map(([name, value]) => (
                <tr key={name}><td className="mono small">{name}</td><td className="mono small">{JSON.stringify(value)}</td></tr>
              ))}</tbody>
            </table>
          )}
          {canOperate && (
            <form className="row wrap" onSubmit={saveOther} aria-label="Set another setting">
              <label className="field">Name<input className="input mono" value={other.name} onChange={(e) => setOther({ ...other, name: e.target.value })} /></label>
              <label className="field">Value (JSON or text; empty deletes)<input className="input mono" value={other.value} onChange={(e) => setOther({ ...other, value: e.target.value })} /></label>
              <button className="btn" type="submit" disabled={busy || !other.name.trim()}>Set</button>
              {errors.other && <span className="reason error small" role="alert">{errors.other}</span>}
            </form>
          )}
        </section>
      </div>
    </>
  );
}
