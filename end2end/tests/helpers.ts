import { expect, type Page, type TestInfo } from "@playwright/test";
import * as fs from "node:fs";
import * as path from "node:path";

/** Opens the page and waits until the WASM has hydrated it. */
export async function openPage(page: Page, url = "/") {
  await page.goto(url);
  await expect(page.locator(".page")).toHaveAttribute("data-hydrated", "true");
}

/** Types a message and sends it. */
export async function send(page: Page, message: string) {
  await page.getByLabel("Message", { exact: true }).fill(message);
  await page.getByRole("button", { name: "Send" }).click();
}

/** The approval card for a tool. */
export function card(page: Page, toolName: string) {
  return page.locator(".approval-card", { has: page.locator("h3 code", { hasText: toolName }) });
}

/** Saves a screenshot of the key state as a test artifact, and beside the tests for a quick look. */
export async function screenshot(page: Page, testInfo: TestInfo, name: string) {
  const file = testInfo.outputPath(`${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  await testInfo.attach(name, { path: file, contentType: "image/png" });
  const gallery = path.join(__dirname, "..", "screenshots");
  fs.mkdirSync(gallery, { recursive: true });
  fs.copyFileSync(file, path.join(gallery, `${name}.png`));
}
