/** A node's telemetry, health reasons with remediation, and what it hosts. */

import { useEffect } from "react";
import type { StateMessage } from "../api/types";
import { Bar, HealthBadge, Icon } from "../components/ui";
import { instanceViews, nodeViews } from "../logic/derive";
import { formatAge, formatBytes, formatPercent, modelName } from "../logic/format";
import { ui } from "../store/ui";

export function NodePanel({ msg, nodeId }: { msg: StateMessage; nodeId: string }) {
  const close = () => ui.set({ nodePanel: null });
  useEffect(() => {
    const onKey = (e: KeyboardEvent) => e.key === "Escape" && close();
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, []);
  const node = nodeViews(msg).find((n) => n.id === nodeId);
  const hosted = instanceViews(msg.state).filter((i) => i.nodes.includes(nodeId));
  const resources = msg.state.nodeResources[nodeId];
  const downloads = msg.state.downloads[nodeId] ?? {};
  return (
    <>
      <div className="panel-backdrop" onClick={close} />
      <aside className="panel" role="dialog" aria-label="Node details" data-testid="node-panel">
        <div className="row between">
          <div className="stack" style={{ gap: 0 }}>
            <h1>{node?.name ?? nodeId.slice(0, 8)}</h1>
            <span className="muted small mono">{nodeId}</span>
          </div>
          <button className="btn ghost" aria-label="Close node details" onClick={close}><Icon name="close" /></button>
        </div>
        {!node ? <div className="reason warn">This node has left the cluster.</div> : (
          <>
            <div className="row wrap">
              <HealthBadge level={node.level} />
              {node.isMaster && <span className="badge accent">master</span>}
              {node.isObserver && <span className="badge">this node</span>}
              <span className="muted small">heard {formatAge(node.lastHeardS)}</span>
            </div>
            <section className="stack">
              <h3>Health</h3>
              {node.reasons.length === 0 ? <span className="small muted">No problems reported.</span> : node.reasons.map((r, i) => (
                <div key={i} className={`reason ${r.level}`} data-testid="panel-reason">
                  <div className="small"><strong>{r.level}</strong>: {r.message}</div>
                  <div className="fix">What to do: {r.remediation}</div>
                </div>
              ))}
            </section>
            <section className="stack">
              <h3>Memory</h3>
              <Bar value={node.ramUsed ?? 0} total={node.ramTotal ?? 0} label={`Memory of ${node.name}`} tone="info" />
              <span className="small muted">{formatBytes(node.ramUsed)} used, {formatBytes(node.ramFree)} free of {formatBytes(node.ramTotal)} ({formatPercent(node.ramUsed ?? 0, node.ramTotal ?? 0)})</span>
            </section>
            {node.disk && (
              <section className="stack">
                <h3>Models disk</h3>
                <Bar value={(node.disk.totalBytes ?? 0) - (node.disk.freeBytes ?? 0)} total={node.disk.totalBytes ?? 0} label={`Disk of ${node.name}`} />
                <span className="small muted">{formatBytes(node.disk.freeBytes)} free of {formatBytes(node.disk.totalBytes)} · <span className="mono">{node.disk.modelsDir}</span></span>
              </section>
            )}
            <section>
              <h3>System</h3>
              <dl className="kv">
                <dt>OS</dt><dd>{node.system?.os ?? "–"} {node.system?.arch ?? ""}</dd>
                <dt>CPU</dt><dd>{node.system?.cpuModel ?? "–"}{node.system?.cpuCount ? ` · ${node.system.cpuCount} cores` : ""}</dd>
                <dt>Python</dt><dd>{node.system?.python ?? "–"}</dd>
                <dt>Skulk</dt><dd>{node.version ?? "–"}</dd>
                <dt>Backends</dt><dd>{node.backends.join(", ") || "–"}</dd>
                <dt>Engines</dt><dd>{Object.entries(resources?.engineBuilds ?? {}).map(([k, v]) => `${k} (${v})`).join(", ") || "–"}</dd>
                <dt>Transport</dt><dd>{resources?.dataTransport ?? "–"}</dd>
                <dt>API port</dt><dd>{resources?.apiPort ?? "–"}</dd>
              </dl>
            </section>
            <section className="stack">
              <h3>Hosts</h3>
              {hosted.length === 0 ? <span className="small muted">No instance.</span> : hosted.map((i) => (
                <div key={i.id} className="shard"><strong>{modelName(i.modelId)}</strong>
                  <span className="muted">{i.shards.find((s) => s.nodeId === nodeId)?.label}</span></div>
              ))}
              {Object.keys(downloads).length > 0 && <span className="small muted">Model files: {Object.keys(downloads).map(modelName).join(", ")}</span>}
            </section>
          </>
        )}
      </aside>
    </>
  );
}
