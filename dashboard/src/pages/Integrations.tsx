/**
 * Connect your tools: configuration for common clients, written from live State (the models with a
 * ready instance, their context and capabilities) and the address this browser reached the node at.
 */

import { useMemo, useState } from "react";
import type { StateMessage } from "../api/types";
import { Empty } from "../components/ui";
import { baseUrl, KEY_PLACEHOLDER, servedModels, snippets } from "../logic/integrations";
import { useCatalog } from "../store/cluster";
import { toast } from "../store/ui";

export async function copyText(text: string): Promise<void> {
  try {
    await navigator.clipboard.writeText(text);
    toast("Copied");
  } catch {
    toast("The browser refused the clipboard: select the text and copy it", "error");
  }
}

export function Integrations({ msg }: { msg: StateMessage }) {
  const catalog = useCatalog();
  const models = useMemo(() => servedModels(msg.state, catalog), [msg.state, catalog]);
  const [chosen, setChosen] = useState<string | null>(null);
  const model = models.find((m) => m.id === chosen) ?? models[0];
  const { url, localOnly } = baseUrl(location.origin);
  return (
    <>
      <div className="page-head"><h1>Integrations</h1>
        <span className="muted">{models.length} model{models.length === 1 ? "" : "s"} ready to serve clients</span></div>
      <div className="stack" style={{ gap: 14 }}>
        <div className="card stack" data-testid="integration-address">
          <h2>Address and key</h2>
          <dl className="kv">
            <dt>Base URL</dt><dd className="mono" data-testid="base-url">{url}</dd>
            <dt>OpenAI-compatible</dt><dd className="mono">{url}/v1</dd>
            <dt>API key</dt><dd><span className="mono">{KEY_PLACEHOLDER}</span> <span className="muted small">replace with a key from the Keys page (loopback clients need none)</span></dd>
          </dl>
          {localOnly && <div className="reason warn small" role="note">This page was opened through {url}, which only works on the node's own host.
            From another machine use the node's LAN address (open the dashboard through it and this page writes it).</div>}
        </div>
        {models.length === 0 ? (
          <div className="card"><Empty title="No model is ready">Launch one from the Models page: clients are configured for models with a ready instance.</Empty></div>
        ) : (
          <>
            <div className="card stack">
              <h2>Models</h2>
              <table className="table" data-testid="served-models">
                <thead><tr><th scope="col">Model</th><th scope="col">Context</th><th scope="col">Capabilities</th><th scope="col">Instances</th><th scope="col"><span className="sr-only">Choose</span></th></tr></thead>
                <tbody>{models.map((m) => (
                  <tr key={m.id} data-testid="served-model" data-model-id={m.id} data-context={m.context ?? ""} className={m.id === model?.id ? "selected" : ""}>
                    <td className="mono">{m.id}</td>
                    <td data-testid="served-context">{m.context ? `${m.context.toLocaleString("en-US")} tokens` : "unknown"}</td>
                    <td><div className="chips">{m.capabilities.map((c) => <span key={c} className="chip">{c}</span>)}</div></td>
                    <td>{m.instances}</td>
                    <td><button className="btn small" aria-pressed={m.id === model?.id} onClick={() => setChosen(m.id)}>Configure {m.id.split("/").pop()}</button></td>
                  </tr>
                ))}</tbody>
              </table>
            </div>
            {model && snippets(url, model).map((s) => (
              <section key={s.id} className="card stack" data-testid="snippet" data-snippet={s.id} aria-label={s.title}>
                <div className="row between">
                  <div className="row"><h2>{s.title}</h2><span className="muted small">{s.where}</span></div>
                  <button className="btn small" aria-label={`Copy ${s.title}`} onClick={() => void copyText(s.text)}>Copy</button>
                </div>
                <pre className="code" tabIndex={0} data-testid="snippet-text">{s.text}</pre>
              </section>
            ))}
          </>
        )}
      </div>
    </>
  );
}
