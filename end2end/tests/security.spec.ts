import { type APIRequestContext, type Browser, expect, type Page, type Request, type Response, test } from "@playwright/test";
import { E2E_TOKEN, MAIN, WITH_TOKEN } from "../playwright.config";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { card, openPage, pendingApproval, screenshot, send, sessionOf } from "./helpers";

/** A name no other test uses, so tests can share the server's workspace. */
function unique(name: string, extension = "txt") {
  return `${name}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 6)}.${extension}`;
}

/** An origin that is not toolgate's, for requests sent directly. */
const EVIL = "http://evil.example";

/**
 * Serves `html` from a server of its own on another port of this machine: a page of another origin, in the same
 * (loopback) address space, so the browser lets it send requests to toolgate and only toolgate's checks stop them.
 */
async function serveAttacker(html: string) {
  const server = http.createServer((_, response) => {
    response.writeHead(200, { "content-type": "text/html" });
    response.end(html);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    // Another port of 127.0.0.1 is the same site (cookies go along) but another origin; localhost is another site.
    origins: [`http://127.0.0.1:${port}`, `http://localhost:${port}`],
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

async function pendingCalls(request: APIRequestContext, runId: string): Promise<string[]> {
  const listed = await (await request.get(`/api/agent/approvals?runId=${runId}`)).json();
  return listed.pending.map((p: { toolCallId: string }) => p.toolCallId);
}

/** How the browser's POST to a toolgate path ended: the status it saw, and why it failed if it did. */
function outcome(page: Page, path: string): Promise<{ status?: number; failure?: string }> {
  return new Promise((resolve) => {
    const result: { status?: number; failure?: string } = {};
    const ours = (request: Request) => request.url() === `${MAIN}${path}` && request.method() === "POST";
    const onResponse = (response: Response) => {
      if (ours(response.request())) result.status = response.status();
    };
    const done = (request: Request) => {
      if (!ours(request)) return;
      const failure = request.failure()?.errorText;
      if (failure !== undefined) result.failure = failure;
      page.off("response", onResponse);
      page.off("requestfinished", done);
      page.off("requestfailed", done);
      resolve(result);
    };
    page.on("response", onResponse);
    page.on("requestfinished", done);
    page.on("requestfailed", done);
  });
}

/** The attacker's page: a fetch with credentials and a plain HTML form, both aimed at toolgate's decision routes. */
function attackerPage(runId: string, callId: string) {
  return `<!DOCTYPE html>
<html><body>
<h1>Win a prize</h1>
<form id="form" method="POST" action="${MAIN}/api/fn/decide" target="sink">
  <input name="run_id" value="${runId}">
  <input name="tool_call_id" value="${callId}">
  <input name="choice" value="Approve">
</form>
<iframe name="sink"></iframe>
<script>
  window.attack = async () => {
    await fetch("${MAIN}/api/agent/approvals/${runId}/${callId}", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ decision: "approve" }),
      credentials: "include",
      mode: "no-cors",
    }).catch(() => {});
    document.getElementById("form").submit();
  };
</script>
</body></html>`;
}

test("a page on another origin cannot approve", async ({ page, request }, testInfo) => {
  const file = unique("victim");
  const { runId, callId } = await pendingApproval(request, `delete ${file}`);
  const attacker = await serveAttacker(attackerPage(runId, callId));
  try {
    for (const origin of attacker.origins) {
      const fetchOutcome = outcome(page, `/api/agent/approvals/${runId}/${callId}`);
      const formOutcome = outcome(page, "/api/fn/decide");
      await page.goto(`${origin}/prize.html`);
      await page.evaluate(() => (window as unknown as { attack: () => Promise<void> }).attack());
      // The fetch reached toolgate, whose answer (a 403, as the direct request below shows) the browser then
      // withheld even as an opaque response: Cross-Origin-Resource-Policy: same-origin.
      expect(await fetchOutcome, origin).toEqual({ failure: "net::ERR_BLOCKED_BY_RESPONSE.NotSameOrigin" });
      // The form's navigation shows toolgate's answer: 403 (and the frame then refuses to display it).
      expect(await formOutcome, origin).toEqual({ status: 403, failure: "net::ERR_BLOCKED_BY_RESPONSE" });
      // The approval is still pending, for the person to decide.
      expect(await pendingCalls(request, runId)).toEqual([callId]);
    }
    await screenshot(page, testInfo, "cross-origin-attacker");
  } finally {
    await attacker.close();
  }

  // The same request with another Origin, sent directly: 403, and the answer says why.
  const direct = await request.post(`/api/agent/approvals/${runId}/${callId}`, {
    headers: { origin: EVIL },
    data: { decision: "approve" },
  });
  expect(direct.status()).toBe(403);
  const body = await direct.json();
  expect(body.ok).toBe(false);
  expect(body.error).toContain(`Cross-site request refused: it comes from a page at ${EVIL}`);
  expect(await pendingCalls(request, runId)).toEqual([callId]);

  // And the person can still decide it.
  const denied = await request.post(`/api/agent/approvals/${runId}/${callId}`, { data: { decision: "deny" } });
  expect(denied.status()).toBe(200);
});

test("a link from another site opens the page with the browser's own conversations", async ({ page }) => {
  await openPage(page);
  await send(page, "list files");
  await expect(page.locator(".turn.assistant")).toHaveCount(1);
  const session = await sessionOf(page);
  const linking = await serveAttacker(`<a id="link" href="${MAIN}/">toolgate</a>`);
  try {
    // localhost is another site than 127.0.0.1.
    await page.goto(`${linking.origins[1]}/`);
    await page.click("#link");
    await expect(page).toHaveURL(`${MAIN}/`);
    await expect(page.locator(".page")).toHaveAttribute("data-hydrated", "true");
    expect(await sessionOf(page)).toBe(session);
    await expect(page.locator(".turn.assistant")).toHaveCount(1);
  } finally {
    await linking.close();
  }
  // The browser's list of its conversations was not started over either.
  await openPage(page);
  expect(await sessionOf(page)).toBe(session);
  await expect(page.locator(`.conversations li[data-session-id="${session}"]`)).toHaveCount(1);
});

test("another origin cannot frame the page to trick a click on Approve", async ({ page, request }) => {
  const { runId, callId } = await pendingApproval(request, `delete ${unique("framed")}`);
  const attacker = await serveAttacker(`<iframe id="victim" src="${MAIN}/" width="800" height="600"></iframe>`);
  try {
    const framed = page.waitForResponse((response) => response.url() === `${MAIN}/`);
    await page.goto(`${attacker.origins[1]}/frame.html`);
    expect((await framed).headers()["x-frame-options"]).toBe("DENY");
    // The browser refuses to show it: no toolgate document in the frame, so no Approve button to click.
    await expect(page.frameLocator("#victim").locator(".page")).toHaveCount(0);
    expect(page.frames().some((frame) => frame.url().startsWith(MAIN))).toBe(false);
  } finally {
    await attacker.close();
  }
  expect(await pendingCalls(request, runId)).toEqual([callId]);
  await request.post(`/api/agent/approvals/${runId}/${callId}`, { data: { decision: "deny" } });
});

/** Fails the test on any dialog, and records it. */
function forbidDialogs(page: Page) {
  const dialogs: string[] = [];
  page.on("dialog", async (dialog) => {
    dialogs.push(dialog.message());
    await dialog.dismiss();
  });
  return dialogs;
}

/** Nothing the payload carries became an element or ran. */
async function expectInert(page: Page, dialogs: string[]) {
  await expect(page.locator('img[src="x"]')).toHaveCount(0);
  // The page's own hydration data may quote the payload inside a script, as escaped JSON; no script *is* it.
  expect(await page.evaluate(() => [...document.scripts].some((s) => s.textContent?.trim() === "window.__pwned=2"))).toBe(false);
  expect(await page.evaluate(() => (window as unknown as { __pwned?: number }).__pwned)).toBeUndefined();
  expect(dialogs).toEqual([]);
}

test("markup in tool arguments and model text is shown as text and never runs", async ({ page }, testInfo) => {
  const dialogs = forbidDialogs(page);
  const payload = `<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>`;
  const file = unique("x", "html");
  await openPage(page);
  await send(page, `write ${file}: ${payload}`);

  const pending = card(page, "write_file");
  await expect(pending).toBeVisible();
  // The card shows the arguments as JSON text: the markup, quotes escaped, as characters.
  await expect(pending.getByLabel("Arguments")).toContainText(`"content": "<img src=x onerror=\\"window.__pwned=1\\"><script>window.__pwned=2</script>"`);
  await expect(page.locator(".turn.user").last()).toHaveText(`write ${file}: ${payload}`);
  await expectInert(page, dialogs);
  await screenshot(page, testInfo, "escaping-card");

  await pending.getByRole("button", { name: "Approve", exact: true }).click();
  await expect(page.locator(".turn.assistant").last()).toHaveText(`write_file wrote ${payload.length} bytes to ${file}.`);

  // The model's text quotes the file back: markup in the model's own words.
  await send(page, `read ${file}`);
  await expect(page.locator(".turn.assistant").last()).toHaveText(`read_file read ${file}: "${payload}"`);
  await expectInert(page, dialogs);
  await screenshot(page, testInfo, "escaping-transcript");

  // Rendered on the server this time: the HTML the browser parses first carries the markup only as text, in the
  // transcript and in the hydration data alike.
  const html = await (await page.request.get("/")).text();
  expect(html).toContain("&lt;img src=x onerror=");
  expect(html).not.toContain("<img src=x");
  expect(html).not.toContain("<script>window.__pwned=2</script>");
  await page.reload();
  await expect(page.locator(".turn.assistant").last()).toHaveText(`read_file read ${file}: "${payload}"`);
  await expect(page.locator(".page")).toHaveAttribute("data-hydrated", "true");
  await expectInert(page, dialogs);
});

test.describe("a server with an access token", () => {
  test.use({ baseURL: WITH_TOKEN });

  test("the browser logs in through a form, gets an HttpOnly cookie and the page works", async ({ page, context, request }, testInfo) => {
    // No token: the API says 401, the page sends the person to the login form.
    expect((await request.get("/api/agent/approvals")).status()).toBe(401);
    await page.goto("/");
    await expect(page).toHaveURL(`${WITH_TOKEN}/login`);
    const token = page.getByLabel("Access token");
    await token.fill("not-the-token");
    await page.getByRole("button", { name: "Log in" }).click();
    await expect(page.getByRole("alert")).toHaveText("That is not the access token. Try again.");
    await screenshot(page, testInfo, "login-wrong-token");

    await page.getByLabel("Access token").fill(E2E_TOKEN);
    await page.getByRole("button", { name: "Log in" }).click();
    await expect(page).toHaveURL(`${WITH_TOKEN}/`);
    await expect(page.locator(".page")).toHaveAttribute("data-hydrated", "true");

    const cookies = await context.cookies(WITH_TOKEN);
    const auth = cookies.find((cookie) => cookie.name === "toolgate_auth");
    expect(auth?.httpOnly).toBe(true);
    expect(auth?.sameSite).toBe("Strict");
    expect(auth?.value).not.toContain(E2E_TOKEN);
    expect(await page.evaluate(() => document.cookie)).not.toContain("toolgate_auth");

    // Server functions and the event stream work with the cookie: a whole approval round trip.
    const file = unique("logged-in");
    await send(page, `write ${file}: hi`);
    const pending = card(page, "write_file");
    await expect(pending).toBeVisible();
    await pending.getByRole("button", { name: "Approve", exact: true }).click();
    await expect(page.locator(".turn.assistant").last()).toHaveText(`write_file wrote 2 bytes to ${file}.`);
    await screenshot(page, testInfo, "login-approved");

    // Scripts use the token itself.
    const listed = await request.get("/api/agent/approvals", { headers: { authorization: `Bearer ${E2E_TOKEN}` } });
    expect(listed.status()).toBe(200);
  });

  /** A browser of its own, logged in through the form. */
  async function loggedIn(browser: Browser) {
    const context = await browser.newContext({ baseURL: WITH_TOKEN });
    const page = await context.newPage();
    await page.goto("/login");
    await page.getByLabel("Access token").fill(E2E_TOKEN);
    await page.getByRole("button", { name: "Log in" }).click();
    await expect(page).toHaveURL(`${WITH_TOKEN}/`);
    return { context, page };
  }

  test("Log out ends the login: a copy of its cookie taken before opens nothing, another login goes on", async ({ browser }, testInfo) => {
    const mine = await loggedIn(browser);
    const theirs = await loggedIn(browser);
    // A copy of the cookie, as another tab kept it or as it was taken off the machine.
    const copied = (await mine.context.cookies(WITH_TOKEN)).filter((cookie) => cookie.name === "toolgate_auth");
    expect(copied).toHaveLength(1);

    await mine.page.getByRole("button", { name: "Log out" }).click();
    await expect(mine.page).toHaveURL(`${WITH_TOKEN}/login`);
    await screenshot(mine.page, testInfo, "logged-out");

    const thief = await browser.newContext({ baseURL: WITH_TOKEN });
    await thief.addCookies(copied);
    const stolen = await thief.newPage();
    await stolen.goto("/");
    await expect(stolen).toHaveURL(`${WITH_TOKEN}/login`);
    await expect(stolen.getByLabel("Access token")).toBeVisible();
    expect((await thief.request.get("/api/agent/approvals")).status()).toBe(401);

    await theirs.page.reload();
    await expect(theirs.page).toHaveURL(`${WITH_TOKEN}/`);
    expect((await theirs.context.request.get("/api/agent/approvals")).status()).toBe(200);
    for (const context of [mine.context, theirs.context, thief]) await context.close();
  });

  test("a page open when its login ends goes to the login form: another tab's, and one with a copy of the cookie", async ({ browser }) => {
    const { context, page: first } = await loggedIn(browser);
    const second = await context.newPage();
    await second.goto("/");
    await expect(second.locator(".page")).toHaveAttribute("data-hydrated", "true");
    const elsewhere = await browser.newContext({ baseURL: WITH_TOKEN });
    await elsewhere.addCookies((await context.cookies(WITH_TOKEN)).filter((cookie) => cookie.name === "toolgate_auth"));
    const copy = await elsewhere.newPage();
    await copy.goto("/");
    await expect(copy.locator(".page")).toHaveAttribute("data-hydrated", "true");

    await first.getByRole("button", { name: "Log out" }).click();
    await expect(first).toHaveURL(`${WITH_TOKEN}/login`);
    // Their event streams end with the login; the pages find out why and go where they can go on.
    await expect(second).toHaveURL(`${WITH_TOKEN}/login?ended`, { timeout: 15_000 });
    await expect(copy).toHaveURL(`${WITH_TOKEN}/login?ended`, { timeout: 15_000 });
    await expect(copy.getByLabel("Access token")).toBeVisible();
    await context.close();
    await elsewhere.close();
  });
});

test("markup smuggled into the page runs no script", async ({ page }) => {
  const refused: string[] = [];
  page.on("console", (message) => {
    if (message.text().includes("Content Security Policy")) refused.push(message.text());
  });
  await openPage(page);
  // Were a model's or a tool's text ever rendered as markup, its handlers and scripts would be inline or from
  // elsewhere: the page's policy refuses both, and the browser says so.
  await page.evaluate(() => {
    const smuggled = document.createElement("div");
    smuggled.innerHTML =
      '<img src="/no-such-image" onerror="window.smuggled = (window.smuggled || 0) + 1">' +
      '<iframe srcdoc="<script>parent.smuggled = 1</script>"></iframe>';
    document.body.append(smuggled);
    const script = document.createElement("script");
    script.src = "http://127.0.0.1:9/evil.js";
    document.body.append(script);
  });
  await expect.poll(() => refused.length).toBeGreaterThanOrEqual(2);
  expect(await page.evaluate(() => (window as unknown as { smuggled?: number }).smuggled)).toBeUndefined();
  // The page itself still works.
  await expect(page.getByRole("button", { name: "Send" })).toBeEnabled();
});
