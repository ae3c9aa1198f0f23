// Headless Debian Chromium through playwright-core (Playwright's own browser download cannot work
// on these machines). A fresh profile per run; the flags keep Chromium off the closed network.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

export const FLAGS = [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
];

export async function openBrowser(extraArgs = []) {
  const profile = mkdtempSync(join(tmpdir(), "skulk-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    args: [...FLAGS, ...extraArgs],
    viewport: { width: 1440, height: 900 },
    deviceScaleFactor: 1,
  });
  const close = async () => {
    await context.close().catch(() => undefined);
    rmSync(profile, { recursive: true, force: true });
  };
  return { context, close };
}

/** A console message as a failure report wants it: Chrome's "Failed to load resource" names no URL,
 * so the URL the message came from is added (what 404'd is then in the test's assertion). */
export function consoleText(message) {
  const where = message.location()?.url;
  return where ? `${message.text()} [${where}]` : message.text();
}
