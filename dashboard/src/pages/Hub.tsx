/**
 * The model hub on the Models page: search by name (the catalog and the hub, `GET /models/search`),
 * add by repository id (and a chosen file) with the files, sizes and quantisations it resolved, and
 * every node's downloads with speed, Cancel and Resume (this node's: the store acts on its own).
 */

import { useRef, useState, type FormEvent } from "react";
import { request } from "../api/client";
import type { StateMessage } from "../api/types";
import { Bar, Icon } from "../components/ui";
import { downloadViews, type DownloadView } from "../logic/derive";
import { formatBytes, modelName } from "../logic/format";
import { refreshCatalog } from "../store/cluster";
import { toast } from "../store/ui";

interface SearchHit { id: string; source: "catalog" | "hub"; downloads?: number; storage_size?: number }
interface HubFile { name: string; size: number }
interface Added { message: string; revision: string; files: HubFile[]; download: string; model_card: { id: string } }

const QUANT = /(?:^|[-_.])((?:I?Q\d(?:_[A-Z0-9]+)*)|BF16|F16|F32)(?=[-_.]|$)/i;

/** "Q4_K_M" from "model-Q4_K_M.gguf"; null for files without one. */
export function quantOf(file: string): string | null {
  if (!file.toLowerCase().endsWith(".gguf")) return null;
  const m = QUANT.exec(file.replace(/\.gguf$/i, ""));
  return m?.[1]?.toUpperCase() ?? null;
}

const message = (exc: unknown) => (exc instanceof Error ? exc.message : String(exc));
const path = (id: string) => id.split("/").map(encodeURIComponent).join("/");

export function HubPanel() {
  const [q, setQ] = useState("");
  const [hits, setHits] = useState<SearchHit[] | null>(null);
  const [note, setNote] = useState<string | null>(null);
  const [repo, setRepo] = useState("");
  const [file, setFile] = useState("");
  const [added, setAdded] = useState<Added | null>(null);
  const [busy, setBusy] = useState<string | null>(null);

  const search = async (e: FormEvent) => {
    e.preventDefault();
    setBusy("search");
    try {
      const r = await request<{ data: SearchHit[]; hub?: string }>(`/models/search?q=${encodeURIComponent(q.trim())}&limit=20`);
      setHits(r.data);
      setNote(r.hub ?? null);
    } catch (exc) {
      toast(message(exc), "error");
    } finally {
      setBusy(null);
    }
  };
  const add = async (repoId: string, chosen?: string) => {
    setBusy(`add:${repoId}`);
    try {
      const r = await request<Added>("/models/add", { method: "POST", body: JSON.stringify({ repo_id: repoId, ...(chosen ? { file: chosen } : {}) }) });
      setAdded(r);
      toast(r.message);
      await refreshCatalog();
    } catch (exc) {
      toast(message(exc), "error");
    } finally {
      setBusy(null);
    }
  };
  return (
    <div className="card stack" data-testid="hub">
      <h2>From the hub</h2>
      <form className="row" onSubmit={search} role="search" aria-label="Search the hub">
        <input className="input" style={{ flex: 1 }} type="search" aria-label="Search the hub by name" placeholder="smollm, qwen2.5 gguf…"
          value={q} onChange={(e) => setQ(e.target.value)} />
        <button className="btn" type="submit" disabled={!q.trim() || busy === "search"}><Icon name="search" />Search</button>
      </form>
      {note && <span className="muted small" role="note">hub {note}</span>}
      {hits && (hits.length === 0 ? <span className="muted small">Nothing found.</span> : (
        <table className="table" data-testid="hub-results">
          <thead><tr><th scope="col">Repository</th><th scope="col">Where</th><th scope="col"><span className="sr-only">Add</span></th></tr></thead>
          <tbody>{hits.map((h) => (
            <tr key={`${h.source}:${h.id}`} data-testid="hub-hit" data-source={h.source} data-repo={h.id}>
              <td className="mono small">{h.id}</td>
              <td className="small">{h.source === "hub" ? `hub · ${h.downloads?.toLocaleString("en-US") ?? 0} downloads` : "in the catalog"}</td>
              <td>{h.source === "hub" && <button className="btn small" aria-label={`Add ${h.id}`} disabled={busy !== null} onClick={() => void add(h.id)}>Add</button>}</td>
            </tr>
          ))}</tbody>
        </table>
      ))}
      <form className="stack" onSubmit={(e) => { e.preventDefault(); void add(repo.trim(), file.trim() || undefined); }} aria-label="Add by repository id">
        <div className="row wrap">
          <label className="field" style={{ flex: 2 }}>Repository id
            <input className="input mono" value={repo} onChange={(e) => setRepo(e.target.value)} placeholder="owner/name" />
          </label>
          <label className="field" style={{ flex: 1 }}>GGUF file (optional)
            <input className="input mono" value={file} onChange={(e) => setFile(e.target.value)} placeholder="model-Q4_K_M.gguf" />
          </label>
        </div>
        <button className="btn" type="submit" disabled={busy !== null || !repo.trim()}><Icon name="plus" />Add from the hub</button>
      </form>
      {added && (
        <div className="stack small" data-testid="hub-added" data-model-id={added.model_card.id} role="status">
          <span>{added.message} · download {added.download}</span>
          <table className="table">
            <thead><tr><th scope="col">File</th><th scope="col">Size</th><th scope="col">Quantisation</th></tr></thead>
            <tbody>{added.files.map((f) => (
              <tr key={f.name} data-testid="hub-file"><td className="mono">{f.name}</td><td>{formatBytes(f.size)}</td><td>{quantOf(f.name) ?? "–"}</td></tr>
            ))}</tbody>
          </table>
        </div>
      )}
    </div>
  );
}

/** Bytes per second of each download, from the readings as they arrive (smoothed). */
function useSpeeds(downloads: DownloadView[]): Map<string, number> {
  const last = useRef(new Map<string, { bytes: number; t: number; rate: number }>());
  const now = performance.now();
  for (const d of downloads) {
    const key = `${d.nodeId}|${d.modelId}`;
    const prev = last.current.get(key);
    if (d.status !== "downloading") {
      last.current.delete(key);
    } else if (!prev) {
      last.current.set(key, { bytes: d.downloaded, t: now, rate: 0 });
    } else if (d.downloaded !== prev.bytes && now > prev.t) {
      const rate = Math.max(0, ((d.downloaded - prev.bytes) * 1000) / (now - prev.t));
      last.current.set(key, { bytes: d.downloaded, t: now, rate: prev.rate ? 0.6 * rate + 0.4 * prev.rate : rate });
    }
  }
  return new Map([...last.current].map(([k, v]) => [k, v.rate]));
}

export function Downloads({ msg }: { msg: StateMessage }) {
  const downloads = downloadViews(msg.state);
  const speeds = useSpeeds(downloads);
  const names = msg.state.nodeIdentities;
  const [cancelled, setCancelled] = useState<Set<string>>(new Set());
  const act = async (d: DownloadView, how: "cancel" | "resume") => {
    try {
      const r = await request<{ message: string }>(`/store/models/${path(d.modelId)}/download`, { method: how === "cancel" ? "DELETE" : "POST" });
      toast(r.message);
      setCancelled((s) => { const n = new Set(s); if (how === "cancel") n.add(d.modelId); else n.delete(d.modelId); return n; });
    } catch (exc) {
      toast(message(exc), "error");
    }
  };
  return (
    <div className="card stack">
      <h2>Downloads</h2>
      {downloads.length === 0 ? <span className="muted small">No downloads.</span> : downloads.map((d) => {
        const key = `${d.nodeId}|${d.modelId}`;
        const speed = speeds.get(key);
        const here = d.nodeId === msg.observerNodeId;
        const stopped = (here && cancelled.has(d.modelId) && d.status !== "completed") || d.status === "failed";
        const status = stopped && d.status !== "failed" ? "cancelled" : d.status;
        return (
          <div key={key} className="stack" style={{ gap: 4 }} data-testid="download" data-status={status} data-model-id={d.modelId} data-node-id={d.nodeId}>
            <div className="row between small">
              <span><strong>{modelName(d.modelId)}</strong> <span className="muted">on {names[d.nodeId]?.friendlyName ?? d.nodeId.slice(0, 8)}</span></span>
              <span className="row">
                <span className="muted" data-testid="download-bytes">{d.status === "completed" ? formatBytes(d.total) : d.total ? `${formatBytes(d.downloaded)} / ${formatBytes(d.total)}` : d.status}
                  {status === "downloading" && speed ? <span data-testid="download-speed"> · {formatBytes(speed)}/s</span> : null}
                  {status === "cancelled" ? " · cancelled (the partial file is kept for a resume)" : null}</span>
                {here && d.status !== "completed" && (stopped
                  ? <button className="btn small" aria-label={`Resume ${d.modelId}`} onClick={() => void act(d, "resume")}>Resume</button>
                  : <button className="btn small" aria-label={`Cancel ${d.modelId}`} onClick={() => void act(d, "cancel")}>Cancel</button>)}
              </span>
            </div>
            <Bar value={d.downloaded} total={d.total} label={`Download of ${d.modelId}`} indeterminate={d.status === "pending" || (d.status === "downloading" && !d.total)}
              tone={d.status === "completed" ? "ok" : d.status === "failed" ? "error" : "info"} />
            {d.phase && status === "downloading" && <span className="muted small">{d.phase}</span>}
            {d.error && <span className="small" style={{ color: "var(--error)" }}>{d.error}</span>}
          </div>
        );
      })}
    </div>
  );
}

