// The dashboard from another machine ([hosts]): run by tests/hosts/test_lan.py inside a network
// namespace of its own (a laptop on the LAN), against a node that requires API keys.
//
//   node e2e/hosts.mjs --url http://10.251.x.2:PORT --out DIR --model MODEL_ID \
//        --operator-key K --inference-key K --doomed-key K --doomed-id ID --nodes 3 --health-node ID \
//        --link URL
//
// Asked for a key; a wrong key is refused with the reason; signs in with the operator key, sees
// every node (and the health reason of --health-node), launches the model and chats; signed in
// with an inference key the placement controls are absent (chat still works); signed in with
// --doomed-key, which this script then revokes (DELETE /v1/keys with the operator key), the page
// is sent back to sign-in; the link `skulk-kernel keys create` printed (--link) opens it signed
// in. Prints `RESULT {json}` last.
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { consoleText, openBrowser } from "./browser.mjs";

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) =>
  a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc, []));
const base = args.url;
const out = args.out;
mkdirSync(out, { recursive: true });
const log = (...m) => console.log(`[${new Date().toISOString().slice(11, 23)}]`, ...m);
const result = { screenshots: [] };

async function shot(page, name) {
  const path = join(out, `hosts-${name}.png`);
  await page.waitForTimeout(150);
  await page.screenshot({ path, fullPage: false });
  result.screenshots.push(path);
}

async function goto(page, name) {
  await page.getByRole("link", { name: new RegExp(`^${name}`) }).click();
  await page.waitForURL(new RegExp(`/ui/${name.toLowerCase()}$`));
}

async function signIn(page, key) {
  await page.getByTestId("sign-in").waitFor();
  await page.getByLabel("API key").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
}

async function chat(page, text) {
  await goto(page, "Chat");
  await page.waitForFunction(() => document.querySelector("select[aria-label='Select chat model']")?.value, null, { timeout: 60_000 });
  await page.getByLabel("Chat message").fill(text);
  await page.getByRole("button", { name: "Send message" }).click();
  await page.getByRole("button", { name: "Send message" }).waitFor({ timeout: 120_000 });
  return (await page.getByTestId("assistant-text").last().textContent()) ?? "";
}

async function operator(page) {
  await page.goto(base + "/");
  await page.getByTestId("sign-in").waitFor();
  result.askedForKey = true;
  await shot(page, "sign-in");

  await signIn(page, "skulk-00000000-not-a-key");
  result.wrongKeyError = await page.getByTestId("sign-in-error").textContent();
  log("wrong key:", result.wrongKeyError);
  await shot(page, "wrong-key");

  await signIn(page, args["operator-key"]);
  const nodes = Number(args.nodes);
  await page.waitForFunction((n) => document.querySelectorAll("[data-testid=node-card]").length === n, nodes, { timeout: 60_000 });
  result.nodeCards = await page.getByTestId("node-card").count();
  result.scope = await page.getByTestId("session").getAttribute("data-scope");
  log("signed in as", result.scope, "sees", result.nodeCards, "nodes");
  if (args["health-node"]) {
    const card = page.locator(`[data-testid=node-card][data-node-id="${args["health-node"]}"]`);
    await page.waitForFunction((id) => {
      const c = document.querySelector(`[data-testid=node-card][data-node-id="${id}"]`);
      return c && /mismatch|runs /.test(c.textContent ?? "") ;
    }, args["health-node"], { timeout: 60_000 }).catch(() => undefined);
    result.healthCard = { level: await card.getAttribute("data-health"), text: await card.textContent() };
    await card.click();
    await page.getByTestId("node-panel").waitFor();
    result.healthReasons = await page.getByTestId("panel-reason").allTextContents();
    await shot(page, "health-of-another-node");
    await page.getByRole("button", { name: "Close node details" }).click();
  }
  await shot(page, "topology-operator");

  const model = args.model;
  await goto(page, "Models");
  await page.getByLabel("Search models").fill(model.split("/").pop().slice(0, 7));
  await page.locator(`[data-testid=catalog-row][data-model-id="${model}"]`).click();
  await page.getByTestId("preview").first().waitFor({ timeout: 30_000 });
  await shot(page, "models-operator");
  const launchedAt = Date.now();
  await page.getByRole("button", { name: `Launch ${model}` }).click();
  await goto(page, "Instances");
  await page.locator("[data-testid=instance-card][data-phase=ready]").first().waitFor({ timeout: 300_000 });
  result.launchToReadyS = (Date.now() - launchedAt) / 1000;
  result.instanceId = await page.locator("[data-testid=instance-card][data-phase=ready]").first().getAttribute("data-instance-id");
  log("ready after", result.launchToReadyS, "s");
  result.answer = await chat(page, "Say hello in one short sentence.");
  log("answer:", JSON.stringify(result.answer.slice(0, 120)));
  await shot(page, "chat-operator");
  await page.getByRole("button", { name: "Sign out" }).click();
}

async function inference(page) {
  await signIn(page, args["inference-key"]);
  await page.getByTestId("session").waitFor({ timeout: 60_000 });
  await goto(page, "Topology");
  await page.getByTestId("node-card").first().waitFor({ timeout: 60_000 });
  result.inferenceNodeCards = await page.getByTestId("node-card").count();
  await shot(page, "topology-inference");
  result.inferenceScope = await page.getByTestId("session").getAttribute("data-scope");
  await goto(page, "Models");
  await page.getByTestId("operator-only").waitFor();
  result.inferenceLaunchButtons = await page.getByRole("button", { name: /^Launch / }).count();
  result.inferencePreviewRows = await page.getByTestId("catalog-row").count();
  await shot(page, "models-inference");
  await goto(page, "Instances");
  await page.getByTestId("instance-card").first().waitFor({ timeout: 30_000 });
  result.inferenceDeleteButtons = await page.getByRole("button", { name: /^Delete / }).count();
  result.inferenceAnswer = await chat(page, "Name one colour.");
  log("inference key answer:", JSON.stringify(result.inferenceAnswer.slice(0, 80)));
  await shot(page, "chat-inference");
  await page.getByRole("button", { name: "Sign out" }).click();
}

async function revoked(page) {
  await signIn(page, args["doomed-key"]);
  await page.getByTestId("session").waitFor({ timeout: 60_000 });
  const revokedAt = Date.now();
  const answer = await fetch(`${base}/v1/keys/${args["doomed-id"]}`, {
    method: "DELETE", headers: { authorization: `Bearer ${args["operator-key"]}` },
  });
  if (!answer.ok) throw new Error(`revoking the key: ${answer.status} ${await answer.text()}`);
  await page.getByTestId("sign-in-error").waitFor({ timeout: 30_000 });
  result.revokedToSignInS = (Date.now() - revokedAt) / 1000;
  result.revokedError = await page.getByTestId("sign-in-error").textContent();
  log("sent back to sign-in after", result.revokedToSignInS, "s:", result.revokedError);
  result.keyLeftInStorage = await page.evaluate(() => sessionStorage.getItem("skulk.apiKey"));
  await shot(page, "revoked");
}

async function link(page) {
  // the link `skulk-kernel keys create` printed: opens signed in, the key gone from the address bar
  await page.goto("about:blank");
  await page.goto(args.link);
  await page.getByTestId("session").waitFor({ timeout: 60_000 });
  result.linkScope = await page.getByTestId("session").getAttribute("data-scope");
  result.linkUrlAfter = page.url();
  log("the printed link opened signed in as", result.linkScope, "at", result.linkUrlAfter);
  await shot(page, "signed-in-by-link");
}

const { context, close } = await openBrowser();
const page = context.pages()[0] ?? (await context.newPage());
const consoleErrors = [];
page.on("console", (m) => m.type() === "error" && consoleErrors.push(consoleText(m)));
page.on("pageerror", (e) => consoleErrors.push(String(e)));
page.setDefaultTimeout(45_000); // beside model suites on two cores, Chromium is slow to draw
let failed = null;
try {
  await operator(page);
  await inference(page);
  await revoked(page);
  if (args.link) await link(page);
} catch (exc) {
  failed = exc;
  await page.screenshot({ path: join(out, "hosts-failure.png") }).catch(() => undefined);
}
result.consoleErrors = consoleErrors;
await close();
console.log("RESULT " + JSON.stringify(result));
if (failed) {
  console.error(failed.stack ?? String(failed));
  process.exit(1);
}
