import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { authHeaders, session, signIn, signedOut, storedKey, takeKeyFromFragment } from "../src/store/session";

/** A tab: sessionStorage, an address bar, and a node answering /v1/whoami. */
function tab(hash: string, answer: (key: string | null) => Response) {
  const items = new Map<string, string>();
  const address = { pathname: "/ui/topology", search: "", hash };
  vi.stubGlobal("sessionStorage", {
    getItem: (k: string) => items.get(k) ?? null,
    setItem: (k: string, v: string) => void items.set(k, v),
    removeItem: (k: string) => void items.delete(k),
  });
  vi.stubGlobal("location", address);
  vi.stubGlobal("history", {
    state: null,
    replaceState: (_s: unknown, _t: string, url: string) => { address.hash = url.includes("#") ? url.slice(url.indexOf("#")) : ""; },
  });
  vi.stubGlobal("fetch", async (_url: string, init?: RequestInit) => {
    const auth = (init?.headers as Record<string, string> | undefined)?.authorization ?? null;
    return answer(auth ? auth.replace("Bearer ", "") : null);
  });
  return { items, address };
}

const json = (status: number, body: unknown) => new Response(JSON.stringify(body), { status });
const node = (key: string | null) =>
  key === "skulk-op"
    ? json(200, { scope: "operator", via: "key", keyId: "op", name: "laptop" })
    : json(401, { error: { message: "this API key is not valid (unknown or revoked)" } });

describe("session", () => {
  beforeEach(() => session.set({ status: "checking", scope: null, via: null, keyName: null, keyId: null, error: null }));
  afterEach(() => vi.unstubAllGlobals());

  it("takes the key from the link's fragment and clears the address bar", () => {
    const { address } = tab("#key=skulk-op&x=1", node);
    expect(takeKeyFromFragment()).toBe("skulk-op");
    expect(address.hash).toBe("#x=1");
    expect(takeKeyFromFragment()).toBeNull();
  });

  it("keeps a good key for the tab and sends it; a refused key is dropped with the reason", async () => {
    tab("", node);
    expect(await signIn("skulk-op")).toBe(true);
    expect(session.get()).toMatchObject({ status: "signed-in", scope: "operator", keyName: "laptop" });
    expect(authHeaders()).toEqual({ authorization: "Bearer skulk-op" });
    signedOut("this API key is not valid (unknown or revoked)");
    expect(session.get().status).toBe("needs-key");
    expect(session.get().error).toContain("revoked");
    expect(storedKey()).toBeNull();
    expect(await signIn("skulk-wrong")).toBe(false);
    expect(session.get().error).toContain("refused");
    expect(authHeaders()).toEqual({});
  });

  it("asks for a key without an error when the node wants one and none was given", async () => {
    tab("", node);
    expect(await signIn(null)).toBe(false);
    expect(session.get()).toMatchObject({ status: "needs-key", error: null });
  });
});
