// Images in Chat for a vision model ([dashboard], [vision]), driven by tests/dashboard/test_dashboard_vision.py:
//
//   node e2e/vision.mjs --url http://127.0.0.1:PORT --out DIR --image FILE.png --vision skulk/echo-vision --text skulk/echo
//
// The text-only model shows no image control; the vision model takes FILE through the file input,
// shows it in the composer and the sent message, and answers. `RESULT {json}`.
import { mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { consoleText, openBrowser } from "./browser.mjs";

const AXE = createRequire(import.meta.url).resolve("axe-core/axe.min.js");
async function axe(page) {
  const found = {};
  for (const theme of ["light", "dark"]) {
    await page.evaluate((t) => { document.documentElement.dataset.theme = t; }, theme);
    await page.waitForTimeout(400);
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
const { context, close } = await openBrowser([]);
const page = context.pages()[0] ?? (await context.newPage());
const consoleErrors = [];
page.on("console", (m) => m.type() === "error" && consoleErrors.push(consoleText(m)));
page.on("pageerror", (e) => consoleErrors.push(String(e)));
const failedResponses = [];
page.on("response", (r) => r.status() >= 400 && failedResponses.push(`${r.status()} ${r.url()}`));
page.setDefaultTimeout(45_000); // beside model suites on two cores, Chromium is slow to draw
let failed = null;
try {
  await page.goto(args.url + "/ui/chat");
  const select = page.getByLabel("Select chat model");
  await page.locator(`select[aria-label='Select chat model'] option[value='${args.vision}']`).waitFor({ state: "attached", timeout: 60_000 });
  await select.selectOption(args.text);
  await page.waitForTimeout(300);
  result.textModelImageControls = await page.getByTestId("image-input").count() + await page.getByTestId("attach-image").count();
  await select.selectOption(args.vision);
  await page.getByTestId("attach-image").waitFor();
  await page.getByTestId("image-input").setInputFiles(args.image);
  await page.getByTestId("attached-image").waitFor();
  await page.getByLabel("Chat message").fill("What is in this picture?");
  result.axe = await axe(page); // with an image attached
  let path = join(args.out, "chat-image-attached-light.png");
  await page.screenshot({ path });
  result.screenshots.push(path);
  await page.getByRole("button", { name: "Send message" }).click();
  await page.getByTestId("sent-image").waitFor();
  await page.getByRole("button", { name: "Send message" }).waitFor({ timeout: 60_000 });
  result.answer = (await page.getByTestId("assistant-text").last().textContent()) ?? "";
  result.attachedAfterSend = await page.getByTestId("attached-image").count();
  await page.evaluate(() => { document.documentElement.dataset.theme = "dark"; });
  await page.waitForTimeout(400);
  path = join(args.out, "chat-image-sent-dark.png");
  await page.screenshot({ path });
  result.screenshots.push(path);
  await page.evaluate(() => { document.documentElement.dataset.theme = "light"; });
  if (args.big) { // over the node's images_max_bytes: its 413 shown on the answer
    await page.getByTestId("image-input").setInputFiles(args.big);
    await page.getByTestId("attached-image").waitFor();
    await page.getByRole("button", { name: "Send message" }).click();
    await page.getByRole("button", { name: "Send message" }).waitFor({ timeout: 60_000 });
    result.bigError = (await page.locator("[data-testid=assistant-message] .reason.error").last().textContent({ timeout: 30_000 })) ?? "";
    path = join(args.out, "chat-image-too-large-light.png");
    await page.screenshot({ path });
    result.screenshots.push(path);
  }
  // Observe's Capabilities section (the providers plugin runs on this node)
  await page.goto(args.url + "/ui/observe");
  await page.getByTestId("capability-row").first().waitFor({ timeout: 30_000 });
  result.capabilities = await page.getByTestId("capability-row").evaluateAll((rows) => rows.map((r) => r.dataset.ref));
  result.axeObserve = await axe(page);
  path = join(args.out, "observe-capabilities-light.png");
  await page.getByTestId("capabilities").screenshot({ path });
  result.screenshots.push(path);
} catch (exc) {
  failed = exc;
  await page.screenshot({ path: join(args.out, "vision-failure.png") }).catch(() => undefined);
}
result.consoleErrors = consoleErrors;
result.failedResponses = failedResponses;
await close();
console.log("RESULT " + JSON.stringify(result));
if (failed) {
  console.error(failed.stack ?? String(failed));
  process.exit(1);
}
