// End-to-end scenarios against a real node, driven by tests/dashboard/test_dashboard_e2e.py.
//
//   node e2e/drive.mjs single --url http://127.0.0.1:PORT --out DIR --model MODEL_ID
//   node e2e/drive.mjs pair   --url http://127.0.0.1:PORT --out DIR --kill-pid PID --kill-node NODE_ID
//
// Prints progress lines and, last, one line `RESULT {json}` that the pytest side reads; exits
// non-zero with the error on failure (after a screenshot of the page as it was).
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { consoleText, openBrowser } from "./browser.mjs";

const args = Object.fromEntries(process.argv.slice(3).reduce((acc, a, i, all) =>
  a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc, []));
const scenario = process.argv[2];
const base = args.url;
const out = args.out;
mkdirSync(out, { recursive: true });
const log = (...m) => console.log(`[${new Date().toISOString().slice(11, 23)}]`, ...m);
const result = { screenshots: [] };

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? (s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2) : null;
}

async function setTheme(page, theme) {
  const current = await page.evaluate(() => document.documentElement.dataset.theme);
  // a DOM click, so the toggle works even under the node panel's backdrop
  if (current !== theme) await page.evaluate(() => document.querySelector("button[aria-label^='Switch to']").click());
  await page.waitForFunction((t) => document.documentElement.dataset.theme === t, theme);
}

async function shoot(page, name) {
  for (const theme of ["light", "dark"]) {
    await setTheme(page, theme);
    await page.waitForTimeout(150); // let transitions settle
    const path = join(out, `${name}-${theme}.png`);
    await page.screenshot({ path, fullPage: false });
    result.screenshots.push(path);
  }
  await setTheme(page, "light");
}

async function goto(page, name) {
  await page.getByRole("link", { name: new RegExp(`^${name}`) }).click();
  await page.waitForURL(new RegExp(`/ui/${name.toLowerCase()}$`));
}

/** Time from a state change request to the page showing it: tracing toggles, n times. */
async function measureLatency(page, n) {
  return page.evaluate(async (n) => {
    const facts = () => document.querySelector("[data-testid=cluster-facts]")?.textContent ?? "";
    const samples = [];
    for (let i = 0; i < n; i++) {
      const want = !facts().includes("tracing on");
      const text = want ? "tracing on" : "tracing off";
      const t0 = performance.now();
      const shown = new Promise((resolve) => {
        const obs = new MutationObserver(() => {
          if (facts().includes(text)) { obs.disconnect(); resolve(performance.now()); }
        });
        obs.observe(document.body, { subtree: true, childList: true, characterData: true });
      });
      const acked = fetch("/v1/tracing", { method: "PUT", body: JSON.stringify({ enabled: want }) }).then(() => performance.now());
      const [tShown, tAck] = await Promise.all([shown, acked]);
      samples.push({ requestToPage: tShown - t0, requestToAck: tAck - t0 });
      await new Promise((r) => setTimeout(r, 300)); // isolated changes, not one coalesced burst
    }
    // what a "changed" ping + refetch design would add: one GET /state per change
    const fetches = [];
    let bytes = 0;
    for (let i = 0; i < 10; i++) {
      const t = performance.now();
      bytes = (await (await fetch("/state")).text()).length;
      fetches.push(performance.now() - t);
    }
    return { samples, stateFetchMs: fetches, stateBytes: bytes };
  }, n);
}

async function single(page) {
  const model = args.model;
  await page.goto(base + "/");
  await page.getByTestId("node-card").first().waitFor();
  result.nodeCards = await page.getByTestId("node-card").count();
  result.nodeHealth = await page.getByTestId("node-card").first().getAttribute("data-health");
  log("topology shows", result.nodeCards, "node(s), health", result.nodeHealth);
  await shoot(page, "topology");

  const lat = await measureLatency(page, 15);
  result.latency = {
    p50RequestToPageMs: median(lat.samples.map((s) => s.requestToPage)),
    p50RequestToAckMs: median(lat.samples.map((s) => s.requestToAck)),
    p50StateFetchMs: median(lat.stateFetchMs),
    stateBytes: lat.stateBytes,
  };
  log("latency", JSON.stringify(result.latency));

  await page.getByTestId("node-card").first().click();
  await page.getByTestId("node-panel").waitFor();
  await shoot(page, "node-panel");
  await page.getByRole("button", { name: "Close node details" }).click();

  await goto(page, "Models");
  await page.getByLabel("Search models").fill(model.split("/").pop().slice(0, 7));
  await page.locator(`[data-testid=catalog-row][data-model-id="${model}"]`).click();
  await page.getByTestId("preview").first().waitFor();
  result.previews = await page.getByTestId("preview").count();
  result.previewText = await page.locator("[data-testid=preview][data-viable=true]").first().innerText();
  await shoot(page, "models");
  const launchedAt = Date.now();
  await page.getByRole("button", { name: `Launch ${model}` }).click();
  await goto(page, "Instances");
  const card = page.locator(`[data-testid=instance-card]`).first();
  await card.waitFor({ timeout: 30_000 });
  result.instanceId = await card.getAttribute("data-instance-id");
  log("launched", result.instanceId, "phase", await card.getAttribute("data-phase"));
  await page.locator(`[data-testid=instance-card][data-phase=ready]`).waitFor({ timeout: 240_000 });
  result.launchToReadyS = (Date.now() - launchedAt) / 1000;
  log("ready after", result.launchToReadyS, "s");
  await shoot(page, "instances");

  await goto(page, "Chat");
  await page.waitForFunction(() => document.querySelector("select[aria-label='Select chat model']")?.value);
  result.chatModel = await page.getByLabel("Select chat model").inputValue();
  await page.getByLabel("Chat message").fill("Say hello in one short sentence.");
  await page.getByRole("button", { name: "Send message" }).click();
  await page.getByRole("button", { name: "Send message" }).waitFor({ timeout: 60_000 });
  result.answer = (await page.getByTestId("assistant-text").last().textContent()) ?? "";
  log("answer:", JSON.stringify(result.answer.slice(0, 120)));

  await page.getByLabel("Chat message").fill(
    "Write a very long, detailed story about a lighthouse keeper, with at least twenty chapters. Number the chapters.");
  await page.getByRole("button", { name: "Send message" }).click();
  // Stop as soon as the answer has begun: a small model may end a "long" answer within a second, and on
  // a loaded box the page may notice 40 characters only after the stream ended (the button is then Send)
  await page.waitForFunction(() => {
    const last = [...document.querySelectorAll("[data-testid=assistant-text]")].at(-1);
    return (last?.textContent ?? "").length > 0;
  }, null, { timeout: 60_000 });
  const stoppedAt = Date.now();
  await page.getByRole("button", { name: "Stop" }).click();
  await page.getByRole("button", { name: "Send message" }).waitFor({ timeout: 10_000 });
  result.stopToIdleMs = Date.now() - stoppedAt;
  const atStop = (await page.getByTestId("assistant-text").last().textContent()) ?? "";
  await page.waitForTimeout(1500);
  const later = (await page.getByTestId("assistant-text").last().textContent()) ?? "";
  result.stopped = { lengthAtStop: atStop.length, lengthLater: later.length,
    meta: await page.getByTestId("message-meta").last().textContent() };
  log("stopped", JSON.stringify(result.stopped));
  await shoot(page, "chat");
  result.conversationsSaved = await page.evaluate(() => JSON.parse(localStorage.getItem("skulk.conversations.v1") ?? "[]").length);

  await goto(page, "Instances");
  await page.getByRole("button", { name: `Delete ${result.instanceId}` }).click();
  await page.locator(`[data-testid=instance-card][data-instance-id="${result.instanceId}"]`).waitFor({ state: "detached", timeout: 30_000 });
  result.deleted = true;
  await goto(page, "Topology");
  result.shardsAfterDelete = await page.getByTestId("node-shard").count();
}

async function pair(page) {
  await page.goto(base + "/ui/topology");
  await page.waitForFunction(() => document.querySelectorAll("[data-testid=node-card]").length === 2, null, { timeout: 60_000 });
  await page.getByTestId("edge").first().waitFor({ timeout: 30_000 });
  result.nodeCards = 2;
  result.edges = await page.getByTestId("edge").count();
  await page.waitForFunction(() => [...document.querySelectorAll("[data-testid=node-card]")].every((c) => c.dataset.health === "ok"), null, { timeout: 30_000 });
  await shoot(page, "topology-two-nodes");
  const victim = page.locator(`[data-testid=node-card][data-node-id="${args["kill-node"]}"]`);
  await victim.waitFor();
  const killedAt = Date.now();
  process.kill(-Number(args["kill-pid"]), "SIGKILL");
  log("killed", args["kill-node"]);
  await page.locator(`[data-testid=node-card][data-node-id="${args["kill-node"]}"][data-health=error]`).waitFor({ timeout: 60_000 });
  result.killToErrorS = (Date.now() - killedAt) / 1000;
  result.errorReason = await victim.getByTestId("health-reason").textContent();
  log("error after", result.killToErrorS, "s:", result.errorReason);
  await shoot(page, "topology-node-down");
  await victim.waitFor({ state: "detached", timeout: 120_000 });
  result.killToRemovedS = (Date.now() - killedAt) / 1000;
  result.edgesAfter = await page.getByTestId("edge").count();
  log("removed after", result.killToRemovedS, "s");
}

const { context, close } = await openBrowser();
const page = context.pages()[0] ?? (await context.newPage());
const consoleErrors = [];
page.on("console", (m) => m.type() === "error" && consoleErrors.push(consoleText(m)));
page.on("pageerror", (e) => consoleErrors.push(String(e)));
page.setDefaultTimeout(45_000); // beside model suites on two cores, Chromium is slow to draw
let failed = null;
try {
  await (scenario === "pair" ? pair(page) : single(page));
} catch (exc) {
  failed = exc;
  await page.screenshot({ path: join(out, `${scenario}-failure.png`) }).catch(() => undefined);
}
result.consoleErrors = consoleErrors;
await close();
console.log("RESULT " + JSON.stringify(result));
if (failed) {
  console.error(failed.stack ?? String(failed));
  process.exit(1);
}
