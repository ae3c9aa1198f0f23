/**
 * Observe: every node's health with its reasons (from State, so any node shows all of them), one
 * node's own diagnostics fetched through this node, the cluster timeline, and traces: turning
 * tracing on and off, and a waterfall of one request's spans across the nodes it crossed; the
 * providers' capabilities per node where the providers plugin runs.
 */

import { useCallback, useEffect, useState } from "react";
import { api, ApiError } from "../api/client";
import type { Span, StateMessage, TimelineEntry, Trace } from "../api/types";
import { Empty, HealthBadge } from "../components/ui";
import { nodeViews } from "../logic/derive";
import { useCanOperate } from "../store/session";
import { toast } from "../store/ui";
import { Capabilities } from "./Capabilities";

const message = (exc: unknown) => (exc instanceof ApiError || exc instanceof Error ? exc.message : String(exc));

export function Observe({ msg }: { msg: StateMessage }) {
  const nodes = nodeViews(msg);
  return (
    <>
      <div className="page-head"><h1>Observe</h1><span className="muted">{nodes.length} node{nodes.length === 1 ? "" : "s"}</span></div>
      <div className="stack" style={{ gap: 14 }}>
        <Health msg={msg} />
        <Capabilities msg={msg} />
        <Traces msg={msg} />
        <Timeline />
      </div>
    </>
  );
}

function Health({ msg }: { msg: StateMessage }) {
  const nodes = nodeViews(msg);
  const [diag, setDiag] = useState<{ nodeId: string; body: string } | null>(null);
  const load = async (nodeId: string) => {
    try {
      setDiag({ nodeId, body: JSON.stringify(await api.nodeDiagnostics(nodeId), null, 2) });
    } catch (exc) {
      setDiag({ nodeId, body: `could not fetch: ${message(exc)}` });
    }
  };
  return (
    <section className="card stack" aria-label="Cluster health">
      <h2>Cluster health</h2>
      <table className="table" data-testid="health">
        <thead><tr><th scope="col">Node</th><th scope="col">Health</th><th scope="col">Reasons</th><th scope="col"><span className="sr-only">Diagnostics</span></th></tr></thead>
        <tbody>{nodes.map((n) => (
          <tr key={n.id} data-testid="health-row" data-node-id={n.id} data-health={n.level}>
            <td><strong>{n.name}</strong><div className="muted small mono">{n.id.slice(0, 12)}</div></td>
            <td><HealthBadge level={n.level} /></td>
            <td>{n.reasons.length === 0 ? <span className="muted small">nothing to report</span> : (
              <div className="stack">{n.reasons.map((r, i) => (
                <div key={i} className={`reason ${r.level} small`} data-testid="health-reason">{r.message}
                  {r.remediation && <div className="fix">{r.remediation}</div>}</div>
              ))}</div>
            )}</td>
            <td><button className="btn small" aria-label={`Diagnostics of ${n.name}`} onClick={() => void load(n.id)}>Diagnostics</button></td>
          </tr>
        ))}</tbody>
      </table>
      {diag && (
        <details open data-testid="diagnostics">
          <summary>Diagnostics of {msg.state.nodeIdentities[diag.nodeId]?.friendlyName ?? diag.nodeId.slice(0, 8)} (GET /v1/diagnostics/cluster/{diag.nodeId.slice(0, 8)}…)</summary>
          <pre className="code" tabIndex={0} style={{ maxHeight: 360 }}>{diag.body}</pre>
        </details>
      )}
    </section>
  );
}

function Traces({ msg }: { msg: StateMessage }) {
  const canOperate = useCanOperate();
  const enabled = msg.state.tracingEnabled;
  const [ids, setIds] = useState<string[]>([]);
  const [trace, setTrace] = useState<Trace | null>(null);
  const [error, setError] = useState<string | null>(null);
  const refresh = useCallback(async () => {
    try {
      setIds((await api.traces()).traceIds.slice().reverse());
    } catch (exc) {
      setError(message(exc));
    }
  }, []);
  useEffect(() => { void refresh(); }, [refresh, enabled]);
  const open = async (id: string) => {
    try {
      setTrace(await api.trace(id));
      setError(null);
    } catch (exc) {
      setError(message(exc));
    }
  };
  const toggle = async () => {
    try {
      await api.setTracing(!enabled);
    } catch (exc) {
      toast(message(exc), "error");
    }
  };
  return (
    <section className="card stack" aria-label="Traces">
      <div className="row between">
        <div className="row"><h2>Traces</h2><span className="badge" data-testid="tracing-state" data-enabled={String(enabled)}>tracing {enabled ? "on" : "off"}</span></div>
        <div className="row">
          <button className="btn small" onClick={() => void refresh()}>Refresh</button>
          {canOperate && <button className="btn small" role="switch" aria-checked={enabled} onClick={() => void toggle()}>
            {enabled ? "Turn tracing off" : "Turn tracing on"}</button>}
        </div>
      </div>
      <span className="muted small">Tracing is cluster-wide (State): while on, every node records the spans of each request it touches.</span>
      {error && <div className="reason error small" role="alert">{error}</div>}
      {ids.length === 0 ? <span className="muted small">No trace on this node{enabled ? " yet: send a request" : ": turn tracing on and send a request"}.</span> : (
        <div className="chips" data-testid="trace-list">{ids.slice(0, 20).map((id) => (
          <button key={id} className={`btn small ${trace?.traceId === id ? "primary" : ""}`} data-testid="trace-id" data-trace-id={id}
            title={`Open trace ${id}`} onClick={() => void open(id)}>{id.slice(0, 12)}</button>
        ))}</div>
      )}
      {trace && <Waterfall trace={trace} />}
    </section>
  );
}

function Waterfall({ trace }: { trace: Trace }) {
  const spans = trace.spans;
  if (!spans.length) return <Empty title="No spans" />;
  const t0 = Math.min(...spans.map((s) => s.start_ns));
  const t1 = Math.max(...spans.map((s) => s.end_ns));
  const total = Math.max(1, t1 - t0);
  const order = trace.nodes;
  const colour = (s: Span) => `var(--series-${(order.indexOf(s.node_id) % 6) + 1})`;
  return (
    <div className="stack" data-testid="waterfall" data-nodes={trace.nodes.length} aria-label={`Trace ${trace.traceId}`}>
      <div className="row wrap small">
        <span className="mono">{trace.traceId}</span>
        <span className="muted">{spans.length} spans · {(total / 1e6).toFixed(1)} ms · {trace.nodes.length} node{trace.nodes.length === 1 ? "" : "s"}:</span>
        {order.map((n) => <span key={n} className="chip" data-testid="trace-node" data-node-id={n}>
          <span className="swatch" style={{ background: `var(--series-${(order.indexOf(n) % 6) + 1})` }} />{trace.nodeNames[n] ?? n.slice(0, 8)}</span>)}
        {Object.keys(trace.unanswered).length > 0 && <span className="reason warn">not answered: {Object.keys(trace.unanswered).join(", ")}</span>}
      </div>
      <table className="table waterfall">
        <thead><tr><th scope="col">Span</th><th scope="col">Node</th><th scope="col">Time</th><th scope="col">ms</th></tr></thead>
        <tbody>{spans.map((s) => {
          const left = ((s.start_ns - t0) / total) * 100;
          const width = Math.max(0.4, ((s.end_ns - s.start_ns) / total) * 100);
          return (
            <tr key={s.span_id} data-testid="span" data-node-id={s.node_id} data-name={s.name}>
              <td className="mono small">{s.name}</td>
              <td className="small">{trace.nodeNames[s.node_id] ?? s.node_id.slice(0, 8)}</td>
              <td className="span-track"><span title={JSON.stringify(s.attributes)} style={{ left: `${left}%`, width: `${width}%`, background: colour(s) }} /></td>
              <td className="small mono">{((s.end_ns - s.start_ns) / 1e6).toFixed(2)}</td>
            </tr>
          );
        })}</tbody>
      </table>
    </div>
  );
}

function describe(e: TimelineEntry): string {
  if (e.kind === "event") return `${e.type ?? "event"}${e.detail ? ` ${typeof e.detail === "string" ? e.detail : JSON.stringify(e.detail)}` : ""}`;
  const { at: _at, kind: _kind, nodeId: _node, nodeName: _name, ...rest } = e;
  return Object.entries(rest).map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join(" ");
}

function Timeline() {
  const [entries, setEntries] = useState<TimelineEntry[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const load = useCallback(async () => {
    try {
      setEntries((await api.timeline(60)).entries.slice().reverse());
      setError(null);
    } catch (exc) {
      setError(message(exc));
    }
  }, []);
  useEffect(() => { void load(); }, [load]);
  return (
    <section className="card stack" aria-label="Timeline">
      <div className="row between"><h2>Timeline</h2><button className="btn small" onClick={() => void load()}>Refresh</button></div>
      {error && <div className="reason error small" role="alert">{error}</div>}
      {entries && (entries.length === 0 ? <span className="muted small">Nothing recorded yet.</span> : (
        <table className="table" data-testid="timeline">
          <thead><tr><th scope="col">When</th><th scope="col">Kind</th><th scope="col">Node</th><th scope="col">What</th></tr></thead>
          <tbody>{entries.map((e, i) => (
            <tr key={`${e.at}-${i}`} data-testid="timeline-entry">
              <td className="small mono">{new Date(e.at * 1000).toLocaleTimeString()}</td>
              <td className="small">{e.kind}</td>
              <td className="small">{e.nodeName ?? (e.nodeId ? e.nodeId.slice(0, 8) : e.seenBy ? `seen by ${e.seenBy.length}` : "")}</td>
              <td className="small mono" style={{ overflowWrap: "anywhere" }}>{describe(e).slice(0, 240)}</td>
            </tr>
          ))}</tbody>
        </table>
      ))}
    </section>
  );
}
