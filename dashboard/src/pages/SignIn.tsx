/** The sign-in page: from another host the node needs an API key, and says why when it refuses one. */

import { useState, type FormEvent } from "react";
import { signIn, useSession } from "../store/session";

export function SignIn() {
  const session = useSession();
  const [key, setKey] = useState("");
  const checking = session.status === "checking";
  const submit = (e: FormEvent) => {
    e.preventDefault();
    if (key.trim()) void signIn(key.trim()).then((ok) => ok && setKey(""));
  };
  return (
    <div className="signin-wrap">
      <form className="card stack signin" onSubmit={submit} data-testid="sign-in" aria-label="Sign in">
        <div className="brand"><img src="/ui/favicon.svg" alt="" />Skulk</div>
        <h1>Sign in with an API key</h1>
        <p className="muted small">
          This node asks a key of every browser that is not on its own host. Create one on a node of the cluster with
          {" "}<code>skulk-kernel keys create --name laptop --scope operator</code>: it prints a link that opens this
          page signed in.
        </p>
        {session.error && <div className="reason error" role="alert" data-testid="sign-in-error">{session.error}</div>}
        <label className="field">API key
          <input className="input mono" type="password" autoComplete="off" spellCheck={false} aria-label="API key"
            placeholder="skulk-…" value={key} onChange={(e) => setKey(e.target.value)} />
        </label>
        <button className="btn primary" type="submit" disabled={checking || !key.trim()}>{checking ? "Checking…" : "Sign in"}</button>
        <dl className="kv small">
          <dt>operator</dt><dd>everything: the cluster, placing and deleting models, chat</dd>
          <dt>inference</dt><dd>the cluster's state and chat; placement needs an operator key</dd>
        </dl>
        <p className="muted small">The key is kept for this browser tab only (session storage) and sent with every request.</p>
      </form>
    </div>
  );
}
