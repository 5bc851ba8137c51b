// Time from navigation to a hydrated, clickable ApprovalBar, in headless Chromium. toolgate-bench runs it:
//
//   node end2end/bench/hydration.mjs --url http://127.0.0.1:PORT [--runs 10] [--warmup 1] [--chromium /usr/bin/chromium]
//
// Each repetition uses a fresh browser context (no cookies, empty cache). It first gives the context's session a
// pending approval (POST /api/agent/runs "delete x.txt", which asks under the default policy), then measures:
//   cold: navigation to "/" with an empty cache;
//   warm: a reload of the same page (the browser revalidates the files and gets 304s).
// Each figure runs from the navigation's start (performance.timeOrigin) to the moment the page is hydrated
// (`.page[data-hydrated="true"]`) and the card's Approve button is enabled, as seen by a MutationObserver installed
// before any page script. Then it clicks Approve and waits until the card leaves (its `approvalResolved` arrived),
// which proves the button really works.
//
// Prints one JSON object on stdout; exits 1 if any repetition failed. Never downloads a browser.

import { chromium } from "@playwright/test";
import { CHROMIUM_ARGS } from "../chromium.mjs";

function options(argv) {
  const values = {
    url: null,
    runs: 10,
    warmup: 1,
    chromium: "/usr/bin/chromium",
    timeout: 30_000,
  };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "");
    const value = argv[i + 1];
    if (!(key in values) || value === undefined) {
      throw new Error(`unknown or incomplete option ${argv[i]}; expected --url URL [--runs N] [--warmup N] [--chromium PATH] [--timeout MS]`);
    }
    values[key] = typeof values[key] === "number" ? Number(value) : value;
  }
  if (!values.url) throw new Error("--url is required");
  values.url = values.url.replace(/\/$/, "");
  return values;
}

// Installed in every document before its scripts run: records when the card shows, when the page is hydrated,
// and when the Approve button is both hydrated and enabled.
const OBSERVER = `(() => {
  const marks = { cardAt: null, hydratedAt: null, clickableAt: null };
  window.__toolgateBench = marks;
  const check = () => {
    const now = performance.now();
    if (marks.cardAt === null && document.querySelector(".approval-card")) marks.cardAt = now;
    if (marks.hydratedAt === null && document.querySelector('.page[data-hydrated="true"]')) marks.hydratedAt = now;
    if (marks.clickableAt === null && marks.hydratedAt !== null) {
      const button = document.querySelector(".approval-card button.approve");
      if (button && !button.disabled && button.isConnected) {
        marks.clickableAt = now;
        observer.disconnect();
      }
    }
  };
  const observer = new MutationObserver(check);
  observer.observe(document, { subtree: true, childList: true, attributes: true });
  document.addEventListener("DOMContentLoaded", check);
})();`;

async function json(response, what) {
  const text = await response.text();
  try {
    return JSON.parse(text);
  } catch {
    throw new Error(`${what}: HTTP ${response.status}, not JSON: ${text.slice(0, 200)}`);
  }
}

/** Starts a run in `session` that waits for approval; returns its run id and tool call id once it is pending. */
async function pendingRun(base, session, timeout) {
  const created = await fetch(`${base}/api/agent/runs`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ message: "delete x.txt", sessionId: session }),
  });
  const body = await json(created, "POST /api/agent/runs");
  if (created.status !== 201 || !body.runId) {
    throw new Error(`POST /api/agent/runs answered ${created.status}: ${JSON.stringify(body)}`);
  }
  const deadline = Date.now() + timeout;
  while (Date.now() < deadline) {
    const listed = await json(await fetch(`${base}/api/agent/approvals?runId=${body.runId}`), "GET /api/agent/approvals");
    if (listed.pending?.length === 1) return { runId: body.runId, callId: listed.pending[0].toolCallId };
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error(`run ${body.runId} did not ask for approval within ${timeout} ms`);
}

/** Navigates, then waits for the marks and reads the navigation's timings. All times are ms since its start. */
async function measure(page, navigate, timeout) {
  await navigate();
  const marks = await (
    await page.waitForFunction(
      () => (window.__toolgateBench?.clickableAt != null ? window.__toolgateBench : null),
      null,
      { timeout, polling: 50 },
    )
  ).jsonValue();
  await page.waitForLoadState("load", { timeout });
  const timings = await page.evaluate(() => {
    const [nav] = performance.getEntriesByType("navigation");
    const resources = performance.getEntriesByType("resource");
    const wasm = resources.find((entry) => entry.name.endsWith(".wasm"));
    return {
      documentMs: nav.responseEnd,
      domContentLoadedMs: nav.domContentLoadedEventEnd,
      loadMs: nav.loadEventEnd,
      wasmResponseEndMs: wasm ? wasm.responseEnd : null,
      transferBytes: nav.transferSize + resources.reduce((sum, entry) => sum + entry.transferSize, 0),
    };
  });
  return {
    clickableMs: marks.clickableAt,
    hydratedMs: marks.hydratedAt,
    cardMs: marks.cardAt,
    ...timings,
  };
}

async function repetition(browser, opts, index) {
  const session = `bench-hydration-${process.pid}-${index}`;
  const { runId, callId } = await pendingRun(opts.url, session, opts.timeout);
  const context = await browser.newContext({ baseURL: opts.url });
  try {
    await context.addCookies([{ name: "toolgate_session", value: session, url: opts.url }]);
    await context.addInitScript(OBSERVER);
    const page = await context.newPage();
    const pageErrors = [];
    page.on("pageerror", (error) => pageErrors.push(error.message));

    const cold = await measure(page, () => page.goto("/", { waitUntil: "commit", timeout: opts.timeout }), opts.timeout);
    const warm = await measure(page, () => page.reload({ waitUntil: "commit", timeout: opts.timeout }), opts.timeout);

    const card = page.locator(`.approval-card[data-tool-call-id="${callId}"]`);
    await card.locator("button.approve").click({ timeout: opts.timeout });
    await card.waitFor({ state: "detached", timeout: opts.timeout });
    if (pageErrors.length > 0) throw new Error(`errors on the page: ${pageErrors.join("; ")}`);
    return { runId, cold, warm };
  } finally {
    await context.close();
  }
}

async function main() {
  const opts = options(process.argv.slice(2));
  const browser = await chromium.launch({
    executablePath: opts.chromium,
    args: CHROMIUM_ARGS,
  });
  const result = { chromium: browser.version(), runs: [], errors: [] };
  try {
    for (let i = 0; i < opts.warmup + opts.runs; i++) {
      try {
        const run = await repetition(browser, opts, i);
        if (i >= opts.warmup) result.runs.push(run);
      } catch (error) {
        result.errors.push(`repetition ${i}: ${error.message}`);
      }
    }
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exitCode = result.errors.length > 0 ? 1 : 0;
}

main().catch((error) => {
  process.stderr.write(`hydration.mjs: ${error.stack ?? error}\n`);
  process.exitCode = 2;
});
