/** The catalog: search, add a local model or one from the hub, watch downloads, preview placements, launch and delete. */

import { useEffect, useMemo, useState, type FormEvent } from "react";
import { api } from "../api/client";
import type { CatalogModel, PlacementPreview, StateMessage } from "../api/types";
import { Empty, Icon, PhaseBadge } from "../components/ui";
import { instanceViews, type InstanceView } from "../logic/derive";
import { formatBytes, modelName } from "../logic/format";
import { defaultChoice, placementBody, previewChoices, type PreviewChoice } from "../logic/previews";
import { refreshCatalog, useCatalog, useCatalogError } from "../store/cluster";
import { useCanOperate } from "../store/session";
import { toast } from "../store/ui";
import { Downloads, HubPanel } from "./Hub";

export function matches(model: CatalogModel, query: string): boolean {
  const q = query.trim().toLowerCase();
  if (!q) return true;
  return [model.id, model.family, model.quantization, ...(model.tasks ?? [])].some((f) => f?.toLowerCase().includes(q));
}

function useAction() {
  const [busy, setBusy] = useState<string | null>(null);
  const run = async (key: string, action: () => Promise<string | void>) => {
    setBusy(key);
    try {
      const message = await action();
      if (message) toast(message);
    } catch (exc) {
      toast(exc instanceof Error ? exc.message : String(exc), "error");
    } finally {
      setBusy(null);
    }
  };
  return { busy, run };
}

export async function deleteInstance(id: string): Promise<string> {
  return (await api.deleteInstance(id)).message;
}

function InstanceRow({ inst, busy, onDelete }: { inst: InstanceView; busy: boolean; onDelete: () => void }) {
  return (
    <div className="row between" data-testid="model-instance" data-instance-id={inst.id}>
      <span className="row"><PhaseBadge phase={inst.phase} /><span className="mono small">{inst.id.slice(0, 8)}</span>
        <span className="muted small">{inst.sharding} · {inst.nodes.length} node{inst.nodes.length === 1 ? "" : "s"}</span></span>
      <button className="btn small danger" aria-label={`Delete ${inst.id}`} disabled={busy} onClick={onDelete}>
        <Icon name="trash" />Delete
      </button>
    </div>
  );
}

function PreviewCard({ choice, selected, onSelect }: { choice: PreviewChoice; selected: boolean; onSelect: () => void }) {
  return (
    <button type="button" className={`preview ${choice.viable ? "viable" : "impossible"} ${selected ? "selected" : ""}`}
      onClick={choice.viable ? onSelect : undefined} aria-pressed={selected} disabled={!choice.viable}
      data-testid="preview" data-viable={choice.viable}>
      <div className="row between">
        <strong>{choice.title}</strong>
        {choice.viable ? <span className="badge ok">fits</span> : <span className="badge error">impossible</span>}
      </div>
      {choice.viable ? choice.nodes.map((n) => (
        <div key={n.nodeId} className="row between small">
          <span>{n.name} <span className="muted">{n.share}</span></span>
          <span className="muted" data-testid="preview-memory">
            {n.weights != null && n.kv != null
              ? `weights ${formatBytes(n.weights)} + KV ${formatBytes(n.kv)}${choice.kvType && choice.kvType !== "f16" ? ` (${choice.kvType})` : ""} · needs ${formatBytes(n.delta)}`
              : `+${formatBytes(n.delta)}`}
            {n.freeAfter != null ? ` · ${formatBytes(n.freeAfter)} free after` : ""}
          </span>
        </div>
      )) : <span className="small muted" data-testid="preview-reason">{choice.reason}</span>}
    </button>
  );
}

function ModelDetail({ model, msg, instances }: { model: CatalogModel; msg: StateMessage; instances: InstanceView[] }) {
  const [previews, setPreviews] = useState<PlacementPreview[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [picked, setPicked] = useState<string | null>(null);
  const { busy, run } = useAction();
  const nodeCount = msg.state.topology.nodes.length;
  useEffect(() => {
    let live = true;
    setPreviews(null);
    setError(null);
    api.previews(model.id).then((p) => live && setPreviews(p)).catch((e: Error) => live && setError(e.message));
    return () => { live = false; };
  }, [model.id, nodeCount]);
  const choices = useMemo(() => previewChoices(previews ?? [], msg.state), [previews, msg.state]);
  const choice = choices.find((c) => c.key === picked) ?? defaultChoice(choices);
  const mine = instances.filter((i) => i.modelId === model.id);
  return (
    <div className="card stack" style={{ gap: 12 }} data-testid="model-detail">
      <div className="row between">
        <div className="stack" style={{ gap: 0 }}>
          <h2 style={{ margin: 0 }}>{modelName(model.id)}</h2>
          <span className="muted small mono">{model.id}</span>
        </div>
        <button className="btn primary" aria-label={`Launch ${model.id}`} disabled={busy !== null || (previews !== null && !choice)}
          onClick={() => run("launch", async () => (await api.place(placementBody(model.id, choice))).message)}>
          Launch
        </button>
      </div>
      <dl className="kv">
        <dt>Family</dt><dd>{model.family ?? "–"}{model.quantization ? ` · ${model.quantization}` : ""}</dd>
        <dt>Size</dt><dd>{formatBytes(model.storage_size)}{model.n_layers ? ` · ${model.n_layers} layers` : ""}</dd>
        <dt>Context</dt><dd>{model.context_length?.toLocaleString() ?? "–"} tokens</dd>
        <dt>Tasks</dt><dd>{model.tasks.join(", ")}</dd>
      </dl>
      <div className="stack">
        <h3>Placement preview</h3>
        {error && <div className="reason error small">{error}</div>}
        {!previews && !error && <span className="muted small">asking the planner…</span>}
        {choices.map((c) => <PreviewCard key={c.key} choice={c} selected={c.key === choice?.key} onSelect={() => setPicked(c.key)} />)}
      </div>
      <div className="stack">
        <h3>Instances</h3>
        {mine.length === 0 ? <span className="muted small">not running</span> : mine.map((inst) => (
          <InstanceRow key={inst.id} inst={inst} busy={busy !== null} onDelete={() => run(inst.id, () => deleteInstance(inst.id))} />
        ))}
      </div>
      {model.custom && (
        <button className="btn small danger" style={{ alignSelf: "flex-start" }} aria-label={`Remove card ${model.id}`}
          onClick={() => run("remove", async () => { const m = (await api.deleteCustomModel(model.id)).message; await refreshCatalog(); return m; })}>
          Remove custom card
        </button>
      )}
    </div>
  );
}

function AddModel() {
  const [path, setPath] = useState("");
  const [id, setId] = useState("");
  const { busy, run } = useAction();
  const submit = (e: FormEvent) => {
    e.preventDefault();
    if (!path.trim()) return;
    void run("add", async () => {
      const message = (await api.addModel(path.trim(), id.trim() || undefined)).message;
      setPath("");
      setId("");
      await refreshCatalog();
      return message;
    });
  };
  return (
    <form className="card stack" onSubmit={submit}>
      <h2>Add a model</h2>
      <label className="field">Local path on this node (a .gguf file or a folder with config.json)
        <input className="input" value={path} onChange={(e) => setPath(e.target.value)} placeholder="/models/my-model.gguf" aria-label="Model path" />
      </label>
      <label className="field">Model id (optional)
        <input className="input" value={id} onChange={(e) => setId(e.target.value)} placeholder="local/my-model" aria-label="Model id" />
      </label>
      <button className="btn" type="submit" disabled={busy !== null || !path.trim()}><Icon name="plus" />Add model</button>
    </form>
  );
}

/** Placing, deleting and adding models are operator actions: an inference key sees why not. */
export function Models({ msg }: { msg: StateMessage }) {
  return useCanOperate() ? <Catalog msg={msg} /> : (
    <>
      <div className="page-head"><h1>Models</h1></div>
      <div className="card" data-testid="operator-only">
        <Empty title="Placing models needs an operator key">
          This browser is signed in with an inference key: it can see the cluster and chat with the models already
          running. Sign in with an operator key to launch, delete or add models.
        </Empty>
      </div>
    </>
  );
}

function Catalog({ msg }: { msg: StateMessage }) {
  const catalog = useCatalog();
  const catalogError = useCatalogError();
  const [query, setQuery] = useState("");
  const [selected, setSelected] = useState<string | null>(null);
  const instances = useMemo(() => instanceViews(msg.state), [msg]);
  const shown = catalog.filter((m) => matches(m, query));
  const model = catalog.find((m) => m.id === selected) ?? shown[0];
  return (
    <>
      <div className="page-head">
        <h1>Models</h1>
        <span className="spacer" />
        <div className="search">
          <Icon name="search" />
          <input className="input" type="search" aria-label="Search models" placeholder="Search models" value={query} onChange={(e) => setQuery(e.target.value)} />
        </div>
      </div>
      <div className="models">
        <div className="card" style={{ padding: 0 }}>
          {catalogError && <div className="reason error" style={{ margin: 12 }}>{catalogError}</div>}
          {shown.length === 0 ? <Empty title={catalog.length ? "No model matches" : "Loading the catalog…"} /> : (
            <table className="table">
              <thead><tr><th>Model</th><th>Size</th><th>Status</th><th /></tr></thead>
              <tbody>
                {shown.map((m) => {
                  const running = instances.filter((i) => i.modelId === m.id);
                  const phase = running.find((i) => i.phase === "ready")?.phase ?? running[0]?.phase;
                  return (
                    <tr key={m.id} className={`clickable ${m.id === model?.id ? "selected" : ""}`} onClick={() => setSelected(m.id)} data-testid="catalog-row" data-model-id={m.id}>
                      <td><div style={{ fontWeight: 600 }}>{modelName(m.id)}</div><div className="muted small mono">{m.id}</div>
                        <div className="chips" style={{ marginTop: 4 }}>{m.tasks.map((t) => <span key={t} className="chip">{t}</span>)}{m.custom && <span className="chip">custom</span>}</div></td>
                      <td className="muted">{formatBytes(m.storage_size)}</td>
                      <td>{phase ? <PhaseBadge phase={phase} /> : m.installed ? <span className="badge">installed</span> : <span className="muted small">–</span>}</td>
                      <td style={{ textAlign: "right" }}>
                        <button className="btn small" onClick={(e) => { e.stopPropagation(); setSelected(m.id); }} aria-label={`Preview ${m.id}`}>Preview</button>
                      </td>
                    </tr>
                  );
                })}
              </tbody>
            </table>
          )}
        </div>
        <div className="stack" style={{ gap: 14 }}>
          {model && <ModelDetail key={model.id} model={model} msg={msg} instances={instances} />}
          <Downloads msg={msg} />
          <HubPanel />
          <AddModel />
        </div>
      </div>
    </>
  );
}
