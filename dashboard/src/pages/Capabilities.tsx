/**
 * Observe's Capabilities section: the providers plugin's capability descriptors per node (id,
 * version, mode, ready, description). Shown only where the node runs the providers plugin, known
 * from its diagnostics (its plugin list, as the steward check does) so a node without it logs no
 * 404; refreshed every 5 s while the page is open, since readiness changes without a State event.
 */

import { useEffect, useState } from "react";
import { request } from "../api/client";
import type { StateMessage } from "../api/types";
import { Empty } from "../components/ui";
import { capabilitiesByNode, hasProviders, type CapabilitiesAnswer } from "../logic/capabilities";
import { nodeViews } from "../logic/derive";
import { useCanOperate } from "../store/session";

export function Capabilities({ msg }: { msg: StateMessage }) {
  const canOperate = useCanOperate();
  const [present, setPresent] = useState(false);
  const [answer, setAnswer] = useState<CapabilitiesAnswer | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    if (!canOperate) return;
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const poll = async () => {
      try {
        const got = await request<CapabilitiesAnswer>("/v1/capabilities");
        if (!stopped) { setAnswer(got); setError(null); }
      } catch (exc) {
        if (!stopped) setError(exc instanceof Error ? exc.message : String(exc));
      }
      if (!stopped) timer = setTimeout(() => void poll(), 5000);
    };
    void (async () => {
      try {
        const found = hasProviders(await request<{ runtime?: { plugins?: string[] } }>("/v1/diagnostics/node"));
        if (stopped || !found) return;
        setPresent(true);
        await poll();
      } catch {
        // no diagnostics: no section
      }
    })();
    return () => { stopped = true; clearTimeout(timer); };
  }, [canOperate]);
  if (!present) return null;
  const names = new Map(nodeViews(msg).map((n) => [n.id, n.name]));
  const groups = answer ? capabilitiesByNode(answer, names) : [];
  return (
    <section className="card stack" aria-label="Capabilities" data-testid="capabilities">
      <h2>Capabilities</h2>
      {error && <div className="reason error small" role="alert">{error}</div>}
      {answer && groups.length === 0 && <Empty title="No capabilities">No node advertises a provider's capability (see docs/extensions.md).</Empty>}
      {groups.map((g) => (
        <div key={g.nodeId} className="stack" data-testid="capability-node" data-node-id={g.nodeId}>
          <h3 className="small">{g.name}</h3>
          {g.error && <div className="reason error small">could not ask this node: {g.error}</div>}
          {g.capabilities.length > 0 && (
            <table className="table">
              <thead><tr><th scope="col">Capability</th><th scope="col">Version</th><th scope="col">Mode</th><th scope="col">Ready</th><th scope="col">Description</th></tr></thead>
              <tbody>{g.capabilities.map((c) => (
                <tr key={`${c.id}@${c.version}`} data-testid="capability-row" data-ref={`${c.id}@${c.version}`}>
                  <td className="mono">{c.id}</td><td className="mono">{c.version}</td><td>{c.mode}</td>
                  <td>{c.ready ? "ready" : "not ready"}</td><td className="small">{c.description ?? ""}</td>
                </tr>
              ))}</tbody>
            </table>
          )}
        </div>
      ))}
    </section>
  );
}
