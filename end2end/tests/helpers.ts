import { type APIRequestContext, expect, type Page, type TestInfo } from "@playwright/test";
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
  return page.locator(".approval-card", { has: page.locator("h2 code", { hasText: toolName }) });
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

/** A file name no other test uses, so tests can share the server's workspace. */
export function unique(name: string, extension = "txt") {
  return `${name}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 6)}.${extension}`;
}

/** The session the page shows: its conversation's id, from the sidebar's current entry. */
export async function sessionOf(page: Page) {
  const id = await page.locator('.conversations li:has(a[aria-current="page"])').getAttribute("data-session-id");
  expect(id).toBeTruthy();
  return id!;
}

/** Writes a file into the server's workspace through the approval API, in a session of its own. */
export async function putFile(request: APIRequestContext, file: string, content: string) {
  const { runId, callId } = await pendingApproval(request, `write ${file}: ${content}`, {
    sessionId: `setup-${Math.random().toString(36).slice(2, 10)}`,
  });
  expect((await request.post(`/api/agent/approvals/${runId}/${callId}`, { data: { decision: "approve" } })).status()).toBe(200);
  await expect.poll(async () => (await (await request.get(`/api/agent/runs/${runId}`)).json()).run?.status ?? "").toBe("done");
}

/** Starts a run over the REST API and waits for its approval to be pending; returns the run and the call. */
export async function pendingApproval(request: APIRequestContext, message: string, options: { sessionId?: string } = {}) {
  const started = await request.post("/api/agent/runs", { data: { message, ...options } });
  expect(started.status()).toBe(201);
  const { runId } = await started.json();
  let callId = "";
  await expect
    .poll(async () => {
      const listed = await (await request.get(`/api/agent/approvals?runId=${runId}`)).json();
      callId = listed.pending[0]?.toolCallId ?? "";
      return callId;
    })
    .not.toBe("");
  return { runId: runId as string, callId };
}
