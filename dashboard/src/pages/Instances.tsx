/** Every instance with its runners, their states, and the cluster's recent instance failures. */

import { useMemo, useState } from "react";
import type { StateMessage } from "../api/types";
import { Bar, Empty, Icon, PhaseBadge, runnerTone, statusName } from "../components/ui";
import { instanceViews, loadProgress } from "../logic/derive";
import { formatTime, modelName } from "../logic/format";
import { deleteInstance } from "./Models";
import { useCanOperate } from "../store/session";
import { toast, ui } from "../store/ui";

export function Instances({ msg }: { msg: StateMessage }) {
  const instances = useMemo(() => instanceViews(msg.state), [msg]);
  const [busy, setBusy] = useState<string | null>(null);
  const canOperate = useCanOperate();
  const names = msg.state.nodeIdentities;
  const failures = [...msg.state.instanceFailures].reverse();
  const remove = async (id: string) => {
    setBusy(id);
    try {
      toast(await deleteInstance(id));
    } catch (exc) {
      toast(exc instanceof Error ? exc.message : String(exc), "error");
    } finally {
      setBusy(null);
    }
  };
  return (
    <>
      <div className="page-head"><h1>Instances</h1><span className="muted">{instances.length} running</span></div>
      <div className="stack" style={{ gap: 14 }}>
        {instances.length === 0 && <div className="card"><Empty title="No instances">Launch a model from the Models page.</Empty></div>}
        {instances.map((inst) => {
          const progress = loadProgress(inst);
          return (
            <article key={inst.id} className="card stack" data-testid="instance-card" data-instance-id={inst.id} data-phase={inst.phase}>
              <div className="row between">
                <div className="row">
                  <strong style={{ fontSize: 15 }}>{modelName(inst.modelId)}</strong>
                  <PhaseBadge phase={inst.phase} />
                  <span className="muted small mono">{inst.id}</span>
                </div>
                {canOperate && (
                  <button className="btn small danger" aria-label={`Delete ${inst.id}`} disabled={busy === inst.id} onClick={() => void remove(inst.id)}>
                    <Icon name="trash" />Delete
                  </button>
                )}
              </div>
              <span className="muted small">
                {inst.kind.replace(/Instance$/, "")} · {inst.sharding} · {inst.engine ?? "?"} engine · context {inst.contextLimit?.toLocaleString() ?? "?"} tokens
              </span>
              {progress != null && inst.phase === "loading" && <Bar value={progress} total={1} label={`Loading ${inst.modelId}`} tone="info" />}
              {inst.error && <div className="reason error small">{inst.error}</div>}
              <table className="table">
                <thead><tr><th>Runner</th><th>Node</th><th>Shard</th><th>Backend</th><th>State</th></tr></thead>
                <tbody>
                  {inst.shards.map((s) => (
                    <tr key={s.runnerId} data-testid="runner-row">
                      <td className="mono small">{s.runnerId.slice(-12)}</td>
                      <td><button className="btn ghost small" onClick={() => s.nodeId && ui.set({ nodePanel: s.nodeId })}>{s.nodeId ? names[s.nodeId]?.friendlyName ?? s.nodeId.slice(0, 8) : "?"}</button></td>
                      <td>{s.label}</td>
                      <td className="mono small">{s.shard?.backend ?? "–"}</td>
                      <td><span className={`badge ${runnerTone(s.status)}`}>{statusName(s.status)}
                        {s.statusBody?.totalLayers ? ` ${s.statusBody.layersLoaded ?? 0}/${s.statusBody.totalLayers}` : ""}</span>
                        {s.statusBody?.errorMessage && <div className="small" style={{ color: "var(--error)", marginTop: 4 }}>{s.statusBody.errorMessage}</div>}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </article>
          );
        })}
        <div className="card stack">
          <h2>Failure history</h2>
          {failures.length === 0 ? <span className="muted small">No instance has failed.</span> : (
            <table className="table" data-testid="failures">
              <thead><tr><th>When</th><th>Model</th><th>Instance</th><th>Reason</th></tr></thead>
              <tbody>{failures.map((f, i) => (
                <tr key={`${f.instanceId}-${i}`}><td className="small">{formatTime(f.at)}</td><td>{modelName(f.modelId)}</td>
                  <td className="mono small">{f.instanceId.slice(0, 8)}</td><td className="small">{f.reason}</td></tr>
              ))}</tbody>
            </table>
          )}
        </div>
      </div>
    </>
  );
}
