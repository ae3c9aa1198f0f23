/** The cluster map: nodes, the links between them, and which node holds which part of each instance. */

import { useMemo } from "react";
import type { StateMessage } from "../api/types";
import { Bar, Empty, HealthBadge, PhaseBadge, seriesColor } from "../components/ui";
import { edges, instanceViews, nodeViews, type InstanceView, type NodeView } from "../logic/derive";
import { formatBytes, formatPercent, modelName } from "../logic/format";
import { ui } from "../store/ui";

function layout(count: number, width: number, height: number): { x: number; y: number }[] {
  if (count === 1) return [{ x: width / 2, y: height / 2 - 10 }];
  const r = Math.min(width, height) / 2 - 62;
  return Array.from({ length: count }, (_, i) => {
    const angle = -Math.PI / 2 + (2 * Math.PI * i) / count + (count === 2 ? Math.PI / 2 : 0);
    return { x: width / 2 + r * Math.cos(angle), y: height / 2 - 10 + r * Math.sin(angle) };
  });
}

function ClusterMap({ msg, nodes, instances }: { msg: StateMessage; nodes: NodeView[]; instances: InstanceView[] }) {
  const W = 460, H = 340;
  const pos = layout(nodes.length, W, H);
  const at = new Map(nodes.map((n, i) => [n.id, pos[i]!]));
  const links = edges(msg.state);
  return (
    <svg className="map" viewBox={`0 0 ${W} ${H}`} role="img" aria-label="Cluster topology map">
      {links.map((e) => {
        const a = at.get(e.a), b = at.get(e.b);
        if (!a || !b) return null;
        return (
          <g key={`${e.a}|${e.b}`} data-testid="edge" data-edge={`${e.a}|${e.b}`}>
            <line className={`edge ${e.bidirectional ? "" : "oneway"}`} x1={a.x} y1={a.y} x2={b.x} y2={b.y} />
            <text className="edge-label" x={(a.x + b.x) / 2} y={(a.y + b.y) / 2 - 6} textAnchor="middle">{e.kinds.join(", ")}</text>
          </g>
        );
      })}
      {nodes.map((n) => {
        const p = at.get(n.id)!;
        const hosted = instances.filter((i) => i.nodes.includes(n.id));
        return (
          <g key={n.id} data-testid="map-node" onClick={() => ui.set({ nodePanel: n.id })}>
            <circle className={`node-circle ${n.level}`} cx={p.x} cy={p.y} r={30} />
            <text x={p.x} y={p.y + 4} textAnchor="middle">{n.isMaster ? "★" : "●"}</text>
            <text x={p.x} y={p.y + 48} textAnchor="middle">{n.name}</text>
            <text className="sub" x={p.x} y={p.y + 63} textAnchor="middle">
              {n.ramFree != null ? `${formatBytes(n.ramFree)} free` : "no telemetry"}
            </text>
            {hosted.map((inst, k) => (
              <rect key={inst.id} x={p.x - (hosted.length * 14) / 2 + k * 14 + 2} y={p.y - 44} width={10} height={10} rx={3}
                fill={seriesColor(instances.indexOf(inst))}><title>{inst.modelId}</title></rect>
            ))}
          </g>
        );
      })}
    </svg>
  );
}

function NodeCard({ node, instances, all }: { node: NodeView; instances: InstanceView[]; all: InstanceView[] }) {
  const hosted = instances.filter((i) => i.nodes.includes(node.id));
  const top = node.reasons[0];
  return (
    <article className={`card node-card ${node.level}`} data-testid="node-card" data-node-id={node.id} data-health={node.level}
      onClick={() => ui.set({ nodePanel: node.id })} aria-label={`Node ${node.name}`}>
      <div className="row between">
        <div className="stack" style={{ gap: 2 }}>
          <span className="node-title">{node.name}</span>
          <span className="muted small mono">{node.id.slice(0, 8)}{node.isMaster ? " · master" : ""}{node.isObserver ? " · this node" : ""}</span>
        </div>
        <HealthBadge level={node.level} />
      </div>
      <div className="stack" style={{ marginTop: 12, gap: 4 }}>
        <div className="row between small">
          <span>Memory</span>
          <span className="muted">
            {node.ramUsed != null ? `${formatBytes(node.ramUsed)} used · ${formatBytes(node.ramFree)} free` : "–"}
          </span>
        </div>
        <Bar value={node.ramUsed ?? 0} total={node.ramTotal ?? 0} label={`Memory used on ${node.name}`}
          tone={node.ramTotal && node.ramUsed != null && node.ramUsed / node.ramTotal > 0.9 ? "error" : "info"} />
        <span className="muted small">{node.ramTotal ? `${formatPercent(node.ramUsed ?? 0, node.ramTotal)} of ${formatBytes(node.ramTotal)}` : ""}</span>
      </div>
      <div className="chips" style={{ marginTop: 10 }}>
        {node.backends.length ? node.backends.map((b) => <span className="chip mono" key={b}>{b}</span>)
          : <span className="muted small">no backends reported</span>}
      </div>
      {top && (
        <div className={`reason ${top.level}`} style={{ marginTop: 10 }} data-testid="health-reason">
          <div className="small">{top.message}</div>
          <div className="fix">{top.remediation}</div>
        </div>
      )}
      {hosted.length > 0 && (
        <div className="stack" style={{ marginTop: 12, gap: 6 }}>
          {hosted.map((inst) => {
            const shard = inst.shards.find((s) => s.nodeId === node.id);
            const s = shard?.shard;
            return (
              <div className="shard" key={inst.id} data-testid="node-shard">
                <span className="swatch" style={{ background: seriesColor(all.indexOf(inst)) }} />
                <span style={{ fontWeight: 600 }}>{modelName(inst.modelId)}</span>
                <span className="muted">{shard?.label}</span>
                {s && inst.sharding === "Pipeline" ? (
                  <span className="layerbar" aria-hidden="true">
                    <span style={{ width: `${(s.startLayer / s.nLayers) * 100}%` }} />
                    <span style={{ width: `${((s.endLayer - s.startLayer) / s.nLayers) * 100}%`, background: seriesColor(all.indexOf(inst)) }} />
                  </span>
                ) : <span style={{ flex: 1 }} />}
                <PhaseBadge phase={inst.phase} />
              </div>
            );
          })}
        </div>
      )}
    </article>
  );
}

export function Topology({ msg }: { msg: StateMessage }) {
  const nodes = useMemo(() => nodeViews(msg), [msg]);
  const instances = useMemo(() => instanceViews(msg.state), [msg]);
  const ready = instances.filter((i) => i.phase === "ready").length;
  const master = nodes.find((n) => n.isMaster);
  const troubled = nodes.filter((n) => n.level !== "ok").length;
  return (
    <>
      <div className="page-head">
        <h1>Topology</h1>
        <span className="spacer" />
        <span className="muted small" data-testid="cluster-facts">
          tracing {msg.state.tracingEnabled ? "on" : "off"} · event {msg.state.lastEventAppliedIdx}
        </span>
      </div>
      <div className="stats">
        <div className="card stat"><div className="value" data-testid="node-count">{nodes.length}</div><div className="label">nodes</div></div>
        <div className="card stat"><div className="value">{ready}/{instances.length}</div><div className="label">instances ready</div></div>
        <div className="card stat"><div className="value" style={{ fontSize: 17, paddingTop: 4 }}>{master?.name ?? "electing…"}</div><div className="label">master</div></div>
        <div className="card stat"><div className="value" style={{ color: troubled ? "var(--error)" : "var(--ok)" }}>{troubled ? troubled : "all ok"}</div><div className="label">{troubled ? "nodes need attention" : "health"}</div></div>
      </div>
      {nodes.length === 0 ? <div className="card"><Empty title="No nodes yet">Waiting for this node's first telemetry…</Empty></div> : (
        <div className="topo">
          <div className="card" style={{ padding: 8 }}><ClusterMap msg={msg} nodes={nodes} instances={instances} /></div>
          <div className="grid grid-nodes">
            {nodes.map((n) => <NodeCard key={n.id} node={n} instances={instances} all={instances} />)}
          </div>
        </div>
      )}
    </>
  );
}
