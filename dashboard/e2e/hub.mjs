// The Models page against a loopback hub ([dashboard] acceptance 1), driven by
// tests/dashboard/test_dashboard_hub.py:
//
//   node e2e/hub.mjs --url http://127.0.0.1:PORT --out DIR --query smollm --repo OWNER/NAME
//
// Searches the hub by name, adds the hit by repository id (its files, sizes and quantisation are
// shown), watches the download's progress and speed, cancels it, resumes it, waits for it to
// complete (the size in MiB, not "1000 B"), launches the model from its placement preview and
// chats with it. Prints `RESULT {json}` last.
import { mkdirSync } from "node:fs";
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

async function shoot(page, name) {
  for (const theme of ["light", "dark"]) {
    const current = await page.evaluate(() => document.documentElement.dataset.theme);
    if (current !== theme) await page.evaluate(() => document.querySelector("button[aria-label^='Switch to']").click());
    await page.waitForFunction((t) => document.documentElement.dataset.theme === t, theme);
    await page.waitForTimeout(150);
    if (!(await page.evaluate(() => Boolean(window.axe)))) await page.addScriptTag({ path: AXE });
    result.axe[`${name}-${theme}`] = await page.evaluate(async () => (await window.axe.run(document, { resultTypes: ["violations"] }))
      .violations.filter((v) => v.impact === "serious" || v.impact === "critical").map((v) => ({ id: v.id, targets: v.nodes.slice(0, 3).map((n) => n.target.join(" ")) })));
    const path = join(out, `${name}-${theme}.png`);
    await page.screenshot({ path, fullPage: false });
    result.screenshots.push(path);
  }
}

async function goto(page, name) {
  await page.getByRole("link", { name: new RegExp(`^${name}`) }).click();
  await page.waitForURL(new RegExp(`/ui/${name.toLowerCase()}$`));
}

const { context, close } = await openBrowser();
const page = context.pages()[0] ?? (await context.newPage());
const consoleErrors = [];
page.on("console", (m) => m.type() === "error" && consoleErrors.push(consoleText(m)));
page.on("pageerror", (e) => consoleErrors.push(String(e)));
page.setDefaultTimeout(45_000); // beside model suites on two cores, Chromium is slow to draw
let failed = null;
const repo = args.repo;
try {
  // the node was started with a dead HF_ENDPOINT: the cluster setting made on the Settings page is what
  // points its next search, add and download at the loopback hub (acceptance 2, the hub endpoint)
  await page.goto(args.url + "/ui/settings");
  await page.getByLabel(/^Hub endpoint/).fill(args["hub-url"]);
  if (args["hub-token"]) await page.getByLabel(/^Hub token/).fill(args["hub-token"]);
  await page.getByRole("button", { name: "Save" }).click();
  await page.getByText(/^Saved/).waitFor();
  await page.goto(args.url + "/ui/models");
  await page.getByTestId("hub").waitFor({ timeout: 60_000 });
  await page.getByLabel("Search the hub by name").fill(args.query);
  await page.getByRole("button", { name: "Search", exact: true }).click();
  const hit = page.locator(`[data-testid=hub-hit][data-source=hub][data-repo="${repo}"]`);
  await hit.waitFor();
  result.hits = await page.getByTestId("hub-hit").evaluateAll((els) => els.map((e) => `${e.dataset.source}:${e.dataset.repo}`));
  log("search found", result.hits);
  await page.getByRole("button", { name: `Add ${repo}` }).click();
  await page.getByTestId("hub-added").waitFor({ timeout: 60_000 });
  result.modelId = await page.getByTestId("hub-added").getAttribute("data-model-id");
  result.files = await page.getByTestId("hub-file").allTextContents();
  log("added", result.modelId, result.files);
  const row = page.locator(`[data-testid=download][data-model-id="${result.modelId}"]`);
  await page.locator(`[data-testid=download][data-model-id="${result.modelId}"][data-status=downloading]`).waitFor({ timeout: 60_000 });
  await row.getByTestId("download-speed").waitFor({ timeout: 30_000 });
  result.speed = await row.getByTestId("download-speed").textContent();
  result.progress = await row.getByTestId("download-bytes").textContent();
  log("downloading:", result.progress);
  await shoot(page, "models-hub-downloading");
  await page.getByRole("button", { name: `Cancel ${result.modelId}` }).click();
  await page.getByRole("button", { name: `Resume ${result.modelId}` }).waitFor();
  await page.waitForTimeout(1500);
  result.afterCancel = { status: await row.getAttribute("data-status"), bytes: await row.getByTestId("download-bytes").textContent() };
  log("cancelled:", JSON.stringify(result.afterCancel));
  await page.getByRole("button", { name: `Resume ${result.modelId}` }).click();
  await page.locator(`[data-testid=download][data-model-id="${result.modelId}"][data-status=completed]`).waitFor({ timeout: 180_000 });
  result.completed = await row.getByTestId("download-bytes").textContent();
  log("completed:", result.completed);
  await page.getByLabel("Search models").fill(repo.split("/").pop().slice(0, 12));
  await page.locator(`[data-testid=catalog-row][data-model-id="${result.modelId}"]`).click();
  await page.locator("[data-testid=preview][data-viable=true]").first().waitFor({ timeout: 30_000 });
  result.previewText = await page.locator("[data-testid=preview][data-viable=true]").first().textContent();
  await page.getByRole("button", { name: `Launch ${result.modelId}` }).click();
  await goto(page, "Instances");
  await page.locator("[data-testid=instance-card][data-phase=ready]").first().waitFor({ timeout: 300_000 });
  await goto(page, "Chat");
  await page.waitForFunction(() => document.querySelector("select[aria-label='Select chat model']")?.value, null, { timeout: 60_000 });
  result.chatModel = await page.getByLabel("Select chat model").inputValue();
  await page.getByLabel("Chat message").fill("Say hello.");
  await page.getByRole("button", { name: "Send message" }).click();
  await page.getByRole("button", { name: "Send message" }).waitFor({ timeout: 120_000 });
  result.answer = (await page.getByTestId("assistant-text").last().textContent()) ?? "";
  log("answer:", JSON.stringify(result.answer.slice(0, 100)));
} catch (exc) {
  failed = exc;
  await page.screenshot({ path: join(out, "hub-failure.png") }).catch(() => undefined);
}
result.consoleErrors = consoleErrors;
await close();
console.log("RESULT " + JSON.stringify(result));
if (failed) {
  console.error(failed.stack ?? String(failed));
  process.exit(1);
}
