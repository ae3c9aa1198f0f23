/**
 * The steward in Chat: `skulk/steward` offered as a model when the node runs the steward plugin
 * (its tool steps stream as reasoning, which Chat already shows apart from the answer), and its
 * proposals, approvable or rejectable in place with an operator key (`/v1/steward`).
 */

import { useEffect, useState } from "react";
import { ApiError, request } from "../api/client";
import { authHeaders, useCanOperate } from "../store/session";
import { toast } from "../store/ui";

export const STEWARD_MODEL = "skulk/steward";

interface Proposal {
  id: string;
  action: { kind: string; instance_id?: string | null; model_id?: string | null; node_id?: string | null };
  rationale?: string;
  status: string;
  created_at: number;
  outcome?: { status?: string; message?: string } | null;
}

export interface StewardStatus {
  status: string;
  ready: boolean;
  reason: string | null;
  model: string | null;
  proposals: Proposal[];
}

/**
 * The steward's status, polled while the page is open; null where the node has no steward. Whether
 * it has one comes from the node's diagnostics (its plugins), not from a 404 of `/v1/steward`,
 * which the browser would log as an error on every node without the plugin (operator keys only:
 * diagnostics are an operator route).
 */
export function useSteward(): StewardStatus | null {
  const canOperate = useCanOperate();
  const [status, setStatus] = useState<StewardStatus | null>(null);
  useEffect(() => {
    if (!canOperate) return;
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const present = async () => {
      try {
        const diag = await request<{ runtime?: { plugins?: string[] } }>("/v1/diagnostics/node");
        return diag.runtime?.plugins?.includes("steward") ?? false;
      } catch {
        return false;
      }
    };
    const poll = async () => {
      try {
        const answer = await fetch("/v1/steward", { headers: authHeaders() });
        if (answer.status === 404) return; // no steward plugin on this node: nothing to poll
        if (answer.ok && !stopped) setStatus((await answer.json()) as StewardStatus);
      } catch {
        // the node is restarting: try again
      }
      if (!stopped) timer = setTimeout(() => void poll(), 2000);
    };
    void present().then((yes) => { if (yes && !stopped) void poll(); });
    return () => { stopped = true; clearTimeout(timer); };
  }, [canOperate]);
  return status;
}

function target(p: Proposal): string {
  const a = p.action;
  return [a.model_id, a.instance_id && `instance ${a.instance_id.slice(0, 8)}`, a.node_id && `node ${a.node_id.slice(0, 8)}`].filter(Boolean).join(" · ");
}

export function StewardProposals({ steward }: { steward: StewardStatus }) {
  const canOperate = useCanOperate();
  const [busy, setBusy] = useState<string | null>(null);
  const shown = steward.proposals.slice(0, 6);
  if (!shown.length) return null;
  const decide = async (p: Proposal, approve: boolean) => {
    setBusy(p.id);
    try {
      await request(`/v1/steward/proposals/${encodeURIComponent(p.id)}/${approve ? "approve" : "reject"}`, { method: "POST" });
      toast(`${approve ? "Approved" : "Rejected"}: ${p.action.kind}`);
    } catch (exc) {
      toast(exc instanceof ApiError ? exc.message : String(exc), "error");
    } finally {
      setBusy(null);
    }
  };
  return (
    <section className="card stack" aria-label="Steward proposals" data-testid="steward-proposals">
      <div className="row between"><h2>Steward proposals</h2>
        <span className="muted small">steward {steward.status}{steward.model ? ` · ${steward.model}` : ""}</span></div>
      {shown.map((p) => (
        <div key={p.id} className="row between wrap" data-testid="proposal" data-proposal-id={p.id} data-status={p.status}>
          <div className="stack" style={{ gap: 2 }}>
            <span><strong>{p.action.kind.replace(/_/g, " ")}</strong> <span className="muted small">{target(p)}</span></span>
            {p.rationale && <span className="small">{p.rationale}</span>}
            {p.outcome?.message && <span className="muted small">{p.outcome.message}</span>}
          </div>
          <div className="row">
            <span className="badge" data-testid="proposal-status">{p.status}</span>
            {p.status === "pending" && canOperate && <>
              <button className="btn small primary" disabled={busy === p.id} onClick={() => void decide(p, true)} aria-label={`Approve ${p.action.kind} ${p.id}`}>Approve</button>
              <button className="btn small" disabled={busy === p.id} onClick={() => void decide(p, false)} aria-label={`Reject ${p.action.kind} ${p.id}`}>Reject</button>
            </>}
          </div>
        </div>
      ))}
    </section>
  );
}
