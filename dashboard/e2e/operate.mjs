// The operator's pages against two real nodes ([dashboard] acceptance 3, 4 and 5), driven by
// tests/dashboard/test_dashboard_operate.py:
//
//   node e2e/operate.mjs --url http://127.0.0.1:PORT --lan-url http://192.0.2.2:PORT --out DIR \
//        --model MODEL_ID --python PYTHON --nodes 2 --right-url http://127.0.0.1:PORT2
//
// Browser A (loopback, no key) creates an operator key on the Keys page; browser B, a second
// browser with its own profile that reaches the node through its LAN address (so the node asks it
// for a key), opens the sign-in link and is signed in. B's Integrations page lists the ready model
// with its context, and its OpenAI SDK snippet, run as written with the key, gets an answer. A
// turns tracing on from the Observe page, chats, and opens the trace's waterfall (spans from both
// nodes). A revokes the key on the Keys page: B is sent back to sign-in. Screenshots of every page
// in both themes. Prints `RESULT {json}` last.
import { spawnSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { consoleText, openBrowser } from "./browser.mjs";

const AXE = createRequire(import.meta.url).resolve("axe-core/axe.min.js");

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) =>
  a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc, []));
const out = args.out;
mkdirSync(out, { recursive: true });
const log = (...m) => console.log(`[${new Date().toISOString().slice(11, 23)}]`, ...m);
const result = { screenshots: [], axe: {} };
let expected400 = false; // the Settings step provokes one on purpose (the node's validation message)

/** axe-core on the page as it is: the serious and critical violations (acceptance 7). */
async function axe(page, name) {
  if (!(await page.evaluate(() => Boolean(window.axe)))) await page.addScriptTag({ path: AXE });
  const found = await page.evaluate(async () => {
    const out = await window.axe.run(document, { resultTypes: ["violations"] });
    return out.violations.filter((v) => v.impact === "serious" || v.impact === "critical")
      .map((v) => ({ id: v.id, impact: v.impact, help: v.help, targets: v.nodes.slice(0, 3).map((n) => n.target.join(" ")) }));
  });
  result.axe[name] = found;
}

async function setTheme(page, theme) {
  const current = await page.evaluate(() => document.documentElement.dataset.theme);
  if (current !== theme) await page.evaluate(() => document.querySelector("button[aria-label^='Switch to']").click());
  await page.waitForFunction((t) => document.documentElement.dataset.theme === t, theme);
}

async function shoot(page, name) {
  for (const theme of ["light", "dark"]) {
    await setTheme(page, theme);
    await page.waitForTimeout(150);
    await axe(page, `${name}-${theme}`);
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

async function keysCreate(a) {
  await goto(a, "Keys");
  await a.getByLabel("Name").fill("browser-b");
  await a.getByLabel("Scope").selectOption("operator");
  await a.getByLabel(/^Tokens per minute/).fill("100000");
  await a.getByRole("button", { name: "Create key" }).click();
  await a.getByTestId("created-key").waitFor();
  result.keyId = await a.getByTestId("created-key").getAttribute("data-key-id");
  result.key = await a.getByTestId("created-key-value").textContent();
  result.link = await a.getByTestId("sign-in-link").getAttribute("href");
  await a.locator(`[data-testid=key-row][data-key-id="${result.keyId}"]`).waitFor();
  result.keyRow = await a.locator(`[data-testid=key-row][data-key-id="${result.keyId}"]`).textContent();
  log("created key", result.keyId, result.keyRow);
  await shoot(a, "keys");
}

async function signInB(b) {
  const link = result.link.replace(args.url, args["lan-url"]);
  await b.goto(link);
  await b.getByTestId("session").waitFor({ timeout: 60_000 });
  result.bScope = await b.getByTestId("session").getAttribute("data-scope");
  result.bUrlAfter = b.url();
  log("browser B signed in by the link as", result.bScope, "at", result.bUrlAfter);
}

async function integrations(b) {
  await goto(b, "Integrations");
  const row = b.locator(`[data-testid=served-model][data-model-id="${args.model}"]`);
  await row.waitFor({ timeout: 60_000 });
  result.servedModels = await b.getByTestId("served-model").count();
  result.servedContext = Number(await row.getAttribute("data-context"));
  result.baseUrl = await b.getByTestId("base-url").textContent();
  result.snippets = await b.locator("[data-testid=snippet]").evaluateAll((els) => els.map((e) => e.dataset.snippet));
  const snippet = await b.locator("[data-snippet=openai-python] [data-testid=snippet-text]").textContent();
  result.openaiSnippet = snippet;
  await shoot(b, "integrations");
  const file = join(out, "openai_snippet.py");
  writeFileSync(file, snippet.replace("YOUR_SKULK_KEY", result.key));
  const started = Date.now();
  const run = spawnSync(args.python, [file], { encoding: "utf8", timeout: 120_000 });
  writeFileSync(file, snippet); // the key does not stay on disk
  result.snippetRun = { rc: run.status, stdout: run.stdout, stderr: (run.stderr ?? "").slice(-2000), s: (Date.now() - started) / 1000 };
  log("the copied OpenAI snippet printed:", JSON.stringify(run.stdout.slice(0, 120)), "rc", run.status);
}

async function chat(page, text) {
  await goto(page, "Chat");
  await page.waitForFunction(() => document.querySelector("select[aria-label='Select chat model']")?.value, null, { timeout: 60_000 });
  await page.getByLabel("Chat message").fill(text);
  await page.getByRole("button", { name: "Send message" }).click();
  await page.getByRole("button", { name: "Send message" }).waitFor({ timeout: 120_000 });
  return (await page.getByTestId("assistant-text").last().textContent()) ?? "";
}

async function observe(a) {
  await goto(a, "Observe");
  await a.locator("[data-testid=health-row]").nth(Number(args.nodes) - 1).waitFor({ timeout: 30_000 });
  result.healthRows = await a.locator("[data-testid=health-row]").count();
  const t0 = Date.now();
  await a.getByRole("switch").click();
  await a.locator("[data-testid=tracing-state][data-enabled=true]").waitFor();
  result.tracingClickToPageMs = Date.now() - t0;
  result.answer = await chat(a, "Name one colour.");
  log("traced answer:", JSON.stringify(result.answer.slice(0, 80)));
  await goto(a, "Observe");
  let nodes = 0;
  for (let i = 0; i < 30 && nodes < Number(args.nodes); i++) {
    await a.getByRole("button", { name: "Refresh" }).first().click();
    const first = a.getByTestId("trace-id").first();
    if (await first.count()) {
      await first.click();
      await a.getByTestId("waterfall").waitFor({ timeout: 5000 }).catch(() => undefined);
      nodes = Number(await a.getByTestId("waterfall").getAttribute("data-nodes").catch(() => "0"));
    }
    if (nodes < Number(args.nodes)) await a.waitForTimeout(500);
  }
  result.traceNodes = nodes;
  result.spans = await a.getByTestId("span").evaluateAll((els) => els.map((e) => ({ node: e.dataset.nodeId, name: e.dataset.name })));
  log("waterfall:", result.spans.length, "spans from", nodes, "nodes");
  await a.getByRole("button", { name: /^Diagnostics of / }).last().click();
  await a.getByTestId("diagnostics").waitFor();
  result.diagnostics = ((await a.getByTestId("diagnostics").textContent()) ?? "").slice(0, 400);
  await a.getByTestId("timeline-entry").first().waitFor({ timeout: 10_000 }).catch(() => undefined);
  result.timelineEntries = await a.getByTestId("timeline-entry").count();
  await a.getByTestId("waterfall").scrollIntoViewIfNeeded();
  await shoot(a, "observe");
  await a.getByRole("switch").click();
  await a.locator("[data-testid=tracing-state][data-enabled=false]").waitFor();
  result.tracingOffShown = true;
}

async function revoke(a, b) {
  await goto(a, "Keys");
  a.once("dialog", (d) => void d.accept());
  const t0 = Date.now();
  await a.getByRole("button", { name: "Revoke browser-b" }).click();
  await a.locator(`[data-testid=key-row][data-key-id="${result.keyId}"]`).waitFor({ state: "detached" });
  await b.getByTestId("sign-in-error").waitFor({ timeout: 30_000 });
  result.revokeToSignInS = (Date.now() - t0) / 1000;
  result.bError = await b.getByTestId("sign-in-error").textContent();
  log("browser B sent to sign-in after", result.revokeToSignInS, "s:", result.bError);
  for (const theme of ["light", "dark"]) { // the sign-in page has no theme switch: set the theme as it would
    await b.evaluate((t) => { document.documentElement.dataset.theme = t; }, theme);
    await axe(b, `sign-in-${theme}`);
    const path = join(out, `sign-in-${theme}.png`);
    await b.screenshot({ path });
    result.screenshots.push(path);
  }
}

/** Settings (acceptance 2): the node's own validation message; a default set on A acts on B. */
async function settings(a) {
  await goto(a, "Settings");
  await a.getByLabel(/^Trace retention/).fill("-5");
  expected400 = true;
  await a.getByRole("button", { name: "Save" }).click();
  await a.getByTestId("setting-error").waitFor();
  await a.waitForTimeout(100);
  expected400 = false;
  result.settingError = await a.getByTestId("setting-error").textContent();
  await a.getByLabel(/^Trace retention/).fill("");
  await a.getByLabel(/^Default context/).fill("2048");
  await a.getByLabel(/^Log level/).selectOption("DEBUG");
  const right = args["right-url"];
  const contextOnRight = async () => {
    const r = await fetch(`${right}/instance/previews?model_id=${encodeURIComponent(args.model)}`);
    const previews = (await r.json()).previews ?? [];
    return previews.flatMap((p) => Object.values(p.memory_by_node ?? {}).map((m) => m.context_tokens));
  };
  result.contextOnRightBefore = await contextOnRight();
  const t0 = Date.now();
  await a.getByRole("button", { name: "Save" }).click();
  let contexts = [];
  let config = {};
  while (Date.now() - t0 < 10_000) {
    contexts = await contextOnRight();
    config = (await (await fetch(`${right}/config`)).json()).settings ?? {};
    if (contexts.length && contexts.every((c) => c === 2048) && config.log_level === "DEBUG") break;
    await new Promise((r) => setTimeout(r, 50));
  }
  result.settingToRightMs = Date.now() - t0;
  result.contextOnRightAfter = contexts;
  result.rightConfig = config;
  log("settings on A in force on B after", result.settingToRightMs, "ms:", JSON.stringify(contexts), config.log_level);
  await shoot(a, "settings");
  await a.getByLabel(/^Default context/).fill("");
  await a.getByLabel(/^Log level/).selectOption("");
  await a.getByRole("button", { name: "Save" }).click();
  await a.waitForFunction(() => !document.querySelector("[data-testid=setting-error]"));
}

async function everyPage(a) {
  for (const name of ["Topology", "Models", "Chat", "Instances"]) {
    await goto(a, name);
    await a.waitForTimeout(300);
    await shoot(a, name.toLowerCase());
  }
  await goto(a, "Topology");
  await a.getByTestId("node-card").first().click();
  await a.getByTestId("node-panel").waitFor();
  await shoot(a, "node-panel-operate");
}

const A = await openBrowser();
const B = await openBrowser();
const a = A.context.pages()[0] ?? (await A.context.newPage());
const b = B.context.pages()[0] ?? (await B.context.newPage());
const consoleErrors = [];
for (const [who, page] of [["A", a], ["B", b]]) {
  page.on("console", (m) => m.type() === "error" && !/401|Unauthorized/.test(m.text())
    && !(expected400 && /status of 400/.test(m.text())) && consoleErrors.push(`${who}: ${consoleText(m)}`));
  page.on("pageerror", (e) => consoleErrors.push(`${who}: ${e}`));
  page.setDefaultTimeout(45_000); // beside model suites on two cores, Chromium is slow to draw
}
let failed = null;
try {
  await a.goto(args.url + "/");
  await a.getByTestId("node-card").first().waitFor({ timeout: 60_000 });
  await keysCreate(a);
  await signInB(b);
  await integrations(b);
  await observe(a);
  await revoke(a, b);
  await settings(a);
  await everyPage(a);
} catch (exc) {
  failed = exc;
  await a.screenshot({ path: join(out, "operate-failure-a.png") }).catch(() => undefined);
  await b.screenshot({ path: join(out, "operate-failure-b.png") }).catch(() => undefined);
}
result.consoleErrors = consoleErrors;
delete result.key;
if (result.link) result.link = result.link.replace(/#key=.*/, "#key=(redacted)");
await A.close();
await B.close();
console.log("RESULT " + JSON.stringify(result));
if (failed) {
  console.error(failed.stack ?? String(failed));
  process.exit(1);
}
