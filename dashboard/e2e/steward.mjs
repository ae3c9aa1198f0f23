// The steward in Chat ([dashboard] Chat), driven by tests/dashboard/test_dashboard_steward.py:
//
//   node e2e/steward.mjs --url http://127.0.0.1:PORT --out DIR --proposal ID
//
// Chats with `skulk/steward` (offered as a model: its tool steps arrive as reasoning, shown apart),
// then approves the pending proposal ID from the Chat page. Prints `RESULT {json}` last.
import { mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { consoleText, openBrowser } from "./browser.mjs";

const AXE = createRequire(import.meta.url).resolve("axe-core/axe.min.js");
/** axe-core's serious and critical violations on the page as it is, in both themes (acceptance 7). */
async function axe(page) {
  const found = {};
  for (const theme of ["light", "dark"]) {
    await page.evaluate((t) => { document.documentElement.dataset.theme = t; }, theme);
    await page.waitForTimeout(400); // colour transitions settle before contrast is measured
    if (!(await page.evaluate(() => Boolean(window.axe)))) await page.addScriptTag({ path: AXE });
    found[theme] = await page.evaluate(async () => (await window.axe.run(document, { resultTypes: ["violations"] }))
      .violations.filter((v) => v.impact === "serious" || v.impact === "critical").map((v) => ({ id: v.id, targets: v.nodes.slice(0, 3).map((n) => n.target.join(" ")) })));
  }
  await page.evaluate(() => { document.documentElement.dataset.theme = "light"; });
  return found;
}

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) =>
  a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc, []));
mkdirSync(args.out, { recursive: true });
const result = { screenshots: [] };
const { context, close } = await openBrowser();
const page = context.pages()[0] ?? (await context.newPage());
const consoleErrors = [];
page.on("console", (m) => m.type() === "error" && consoleErrors.push(consoleText(m)));
page.on("pageerror", (e) => consoleErrors.push(String(e)));
page.setDefaultTimeout(45_000); // beside model suites on two cores, Chromium is slow to draw
let failed = null;
try {
  await page.goto(args.url + "/ui/chat");
  const proposal = page.locator(`[data-testid=proposal][data-proposal-id="${args.proposal}"]`);
  await proposal.waitFor({ timeout: 30_000 });
  result.options = await page.locator("select[aria-label='Select chat model'] option").evaluateAll((os) => os.map((o) => o.value));
  await page.getByLabel("Select chat model").selectOption("skulk/steward");
  await page.getByLabel("Chat message").fill("What is running on the cluster?");
  await page.getByRole("button", { name: "Send message" }).click();
  await page.getByRole("button", { name: "Send message" }).waitFor({ timeout: 120_000 });
  result.answer = (await page.getByTestId("assistant-text").last().textContent()) ?? "";
  result.reasoning = await page.locator(".thinking").count();
  result.statusBefore = await proposal.getAttribute("data-status");
  result.axe = await axe(page);
  const path = join(args.out, "chat-steward-light.png");
  await page.screenshot({ path });
  result.screenshots.push(path);
  await proposal.getByRole("button", { name: /^Approve / }).click();
  await page.waitForFunction((id) => document.querySelector(`[data-testid=proposal][data-proposal-id="${id}"]`)?.dataset.status !== "pending",
    args.proposal, { timeout: 30_000 });
  result.statusAfter = await proposal.getAttribute("data-status");
} catch (exc) {
  failed = exc;
  await page.screenshot({ path: join(args.out, "steward-failure.png") }).catch(() => undefined);
}
result.consoleErrors = consoleErrors;
await close();
console.log("RESULT " + JSON.stringify(result));
if (failed) {
  console.error(failed.stack ?? String(failed));
  process.exit(1);
}
