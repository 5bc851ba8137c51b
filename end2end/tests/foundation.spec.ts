import { expect, test } from "@playwright/test";
import { openPage, screenshot } from "./helpers";

test("the page served by the binary hydrates and responds to clicks", async ({ page }, testInfo) => {
  const errors: string[] = [];
  page.on("pageerror", (error) => errors.push(error.message));
  // The page's Content-Security-Policy lets every script and style of its own run: the browser reports none refused.
  page.on("console", (message) => {
    if (message.text().includes("Content Security Policy")) errors.push(message.text());
  });
  const wasm = page.waitForResponse((response) => response.url().endsWith("/pkg/toolgate.wasm"));

  await openPage(page);
  await expect(page).toHaveTitle("toolgate");
  expect((await wasm).status()).toBe(200);

  // The debug console toggle has no server-side behaviour: it works only once the WASM is live.
  const toggle = page.getByRole("button", { name: /Show debug console/ });
  await expect(toggle).toHaveAttribute("aria-expanded", "false");
  await expect(page.locator("#debug-log")).toBeHidden();
  await toggle.click();
  await expect(page.getByRole("button", { name: /Hide debug console/ })).toHaveAttribute("aria-expanded", "true");
  await expect(page.locator("#debug-log")).toBeVisible();
  await expect(page.getByRole("button", { name: "Send" })).toBeEnabled();
  await screenshot(page, testInfo, "foundation-hydrated");
  expect(errors).toEqual([]);
});

test("the binary serves its embedded site, precompressed", async ({ request }) => {
  for (const [file, type] of [
    ["/pkg/toolgate.wasm", "application/wasm"],
    ["/pkg/toolgate.js", "text/javascript"],
    ["/pkg/toolgate.css", "text/css"],
    ["/favicon.svg", "image/svg+xml"],
  ]) {
    const plain = await request.get(file, { headers: { "accept-encoding": "identity" } });
    expect(plain.status(), file).toBe(200);
    expect(plain.headers()["content-type"], file).toContain(type);
    const br = await request.get(file, { headers: { "accept-encoding": "br" } });
    expect(br.headers()["content-encoding"], file).toBe("br");
  }
  const health = await request.get("/healthz");
  // `ok`, this process's instance id and the store it runs on (serve.sh starts it on the default SQLite file).
  expect(await health.text()).toMatch(/^ok\ninstance: \S+\nstore: sqlite\n$/);
});
