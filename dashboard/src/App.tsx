/**
 * The shell: navigation, theme switch, live-connection indicator, the current page, the node panel.
 * Until the node knows who this browser is (no key on loopback, an API key elsewhere) it shows the
 * sign-in page instead.
 */

import { useEffect } from "react";
import { Icon } from "./components/ui";
import { Chat } from "./pages/Chat";
import { Instances } from "./pages/Instances";
import { Integrations } from "./pages/Integrations";
import { Keys } from "./pages/Keys";
import { Models } from "./pages/Models";
import { NodePanel } from "./pages/NodePanel";
import { Observe } from "./pages/Observe";
import { Settings } from "./pages/Settings";
import { SignIn } from "./pages/SignIn";
import { Topology } from "./pages/Topology";
import { connect, useConnection, useMessage } from "./store/cluster";
import { signOut, startSession, useSession } from "./store/session";
import { PAGES, navigate, pageFromPath, setTheme, ui, useNodePanel, usePage, useTheme, useToasts, type Page } from "./store/ui";

const TITLES: Record<Page, string> = {
  topology: "Topology", models: "Models", chat: "Chat", instances: "Instances",
  observe: "Observe", integrations: "Integrations", keys: "Keys", settings: "Settings",
};

export function App() {
  const session = useSession();
  useEffect(() => { void startSession(); }, []);
  if (session.status === "signed-in") return <Dashboard />;
  if (session.status === "checking" && !session.error) {
    return <div className="signin-wrap"><div className="card"><div className="empty"><strong>Connecting to the node…</strong></div></div></div>;
  }
  return <SignIn />;
}

const SCOPE_TEXT = {
  operator: "operator key: everything",
  inference: "inference key: view and chat; placing models needs an operator key",
} as const;

function Dashboard() {
  const session = useSession();
  const page = usePage();
  const theme = useTheme();
  const msg = useMessage();
  const connection = useConnection();
  const panel = useNodePanel();
  const toasts = useToasts();
  useEffect(() => connect(), []);
  useEffect(() => {
    const onPop = () => ui.set({ page: pageFromPath(location.pathname) });
    window.addEventListener("popstate", onPop);
    return () => window.removeEventListener("popstate", onPop);
  }, []);
  useEffect(() => { document.title = `${TITLES[page]} · Skulk`; }, [page]);
  const counts: Partial<Record<Page, number>> = msg
    ? { topology: msg.state.topology.nodes.length, instances: Object.keys(msg.state.instances).length }
    : {};
  return (
    <div className="shell">
      <nav className="sidebar" aria-label="Pages">
        <div className="brand"><img src="/ui/favicon.svg" alt="" />Skulk</div>
        {PAGES.map((p) => (
          <a key={p} href={`/ui/${p}`} className="nav-item" aria-current={p === page ? "page" : undefined}
            onClick={(e) => { e.preventDefault(); navigate(p); }}>
            <Icon name={p} />{TITLES[p]}
            {counts[p] !== undefined && <span className="nav-count">{counts[p]}</span>}
          </a>
        ))}
        <div className="sidebar-foot">
          <div className="conn" data-testid="connection" data-state={connection}>
            <span className={`dot ${connection === "live" ? "live" : "down pulse"}`} style={{ color: connection === "live" ? "var(--ok)" : "var(--warn)" }} />
            {connection === "live" ? "live" : connection === "connecting" ? "connecting…" : "reconnecting…"}
            {msg && <span className="muted">· {msg.state.nodeIdentities[msg.observerNodeId]?.friendlyName ?? ""}</span>}
          </div>
          {session.via === "key" && session.scope && (
            <div className="small stack" style={{ gap: 6 }} data-testid="session" data-scope={session.scope}>
              <span title={SCOPE_TEXT[session.scope]}>
                <span className="chip">{session.scope}</span> <span className="muted">{session.keyName ?? session.keyId}</span>
              </span>
              <span className="muted">{SCOPE_TEXT[session.scope]}</span>
              <button className="btn small" onClick={() => signOut()}>Sign out</button>
            </div>
          )}
          <button className="btn" aria-label={theme === "dark" ? "Switch to light theme" : "Switch to dark theme"}
            onClick={() => setTheme(theme === "dark" ? "light" : "dark")}>
            <Icon name={theme === "dark" ? "sun" : "moon"} />{theme === "dark" ? "Light" : "Dark"}
          </button>
        </div>
      </nav>
      <main className="main">
        {!msg ? <div className="card"><div className="empty"><strong>Connecting to the node…</strong>Waiting for the first State message.</div></div>
          : page === "topology" ? <Topology msg={msg} />
          : page === "models" ? <Models msg={msg} />
          : page === "chat" ? <Chat msg={msg} />
          : page === "observe" ? <Observe msg={msg} />
          : page === "integrations" ? <Integrations msg={msg} />
          : page === "keys" ? <Keys />
          : page === "settings" ? <Settings />
          : <Instances msg={msg} />}
      </main>
      {msg && panel && <NodePanel msg={msg} nodeId={panel} />}
      <div className="toasts" aria-live="polite">
        {toasts.map((t) => <div key={t.id} className={`toast ${t.kind}`} role={t.kind === "error" ? "alert" : "status"}>{t.text}</div>)}
      </div>
    </div>
  );
}
