// Speech in Chat ([dashboard] acceptance 6), driven by tests/dashboard/test_dashboard_voice.py:
//
//   node e2e/voice.mjs --url http://127.0.0.1:PORT --out DIR --audio FILE.wav --model skulk/echo
//
// Chromium's fake capture device plays FILE as the microphone: the recording, transcribed by the
// node, becomes the prompt; the answer is then read aloud and played to its end. `RESULT {json}`.
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
const log = (...m) => console.log(`[${new Date().toISOString().slice(11, 23)}]`, ...m);
const result = { screenshots: [] };
const { context, close } = await openBrowser([
  "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
  `--use-file-for-fake-audio-capture=${args.audio}`, "--autoplay-policy=no-user-gesture-required",
]);
const page = context.pages()[0] ?? (await context.newPage());
const consoleErrors = [];
page.on("console", (m) => m.type() === "error" && consoleErrors.push(consoleText(m)));
page.on("pageerror", (e) => consoleErrors.push(String(e)));
page.setDefaultTimeout(45_000); // beside model suites on two cores, Chromium is slow to draw
let failed = null;
try {
  await page.goto(args.url + "/ui/chat");
  await page.getByTestId("mic").waitFor({ timeout: 60_000 });
  await page.getByLabel("Select chat model").selectOption(args.model);
  await page.getByTestId("mic").click();
  await page.locator("[data-testid=mic][data-state=recording]").waitFor();
  await page.waitForTimeout(Number(args["record-ms"] ?? 4000));
  await page.getByTestId("mic").click();
  await page.waitForFunction(() => document.querySelector("textarea[aria-label='Chat message']")?.value.trim(), null, { timeout: 60_000 });
  result.prompt = await page.getByLabel("Chat message").inputValue();
  log("the microphone said:", JSON.stringify(result.prompt));
  await page.getByRole("button", { name: "Send message" }).click();
  await page.getByRole("button", { name: "Send message" }).waitFor({ timeout: 60_000 });
  result.answer = (await page.getByTestId("assistant-text").last().textContent()) ?? "";
  const t0 = Date.now();
  await page.getByTestId("speak").last().click();
  await page.locator("[data-testid=speak][data-state=playing]").waitFor({ timeout: 60_000 });
  result.speechStartMs = Date.now() - t0;
  await page.waitForFunction(() => document.body.dataset.spokenAt, null, { timeout: 60_000 });
  result.spokenMs = Date.now() - t0;
  log("answer spoken: started after", result.speechStartMs, "ms, ended after", result.spokenMs, "ms");
  result.axe = await axe(page);
  const path = join(args.out, "chat-voice-light.png");
  await page.screenshot({ path });
  result.screenshots.push(path);
} catch (exc) {
  failed = exc;
  await page.screenshot({ path: join(args.out, "voice-failure.png") }).catch(() => undefined);
}
result.consoleErrors = consoleErrors;
await close();
console.log("RESULT " + JSON.stringify(result));
if (failed) {
  console.error(failed.stack ?? String(failed));
  process.exit(1);
}
