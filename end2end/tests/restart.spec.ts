// The server killed while a card waits, then started again on the same SQLite database: the durable store kept the
// approval, and the open page reconnects by itself and decides it on the new process.
import { expect, test } from "@playwright/test";
import { type ChildProcess, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { BINARY, RESTARTED } from "../playwright.config";
import { card, openPage, screenshot, send, unique } from "./helpers";

/** A started server and what it wrote to stderr, to show when it does not come up. */
interface Server {
  process: ChildProcess;
  stderr: () => string;
}

/**
 * Starts the binary the way serve.sh does (copied alone into `dir` and run there), with its SQLite database in
 * `dir` unless another is named, and waits until it answers. Every start in the same `dir` uses the same database and workspace.
 */
async function start(dir: string, database = `sqlite://${path.join(dir, "toolgate.db")}`): Promise<Server> {
  const port = new URL(RESTARTED).port;
  const binary = path.join(dir, "toolgate");
  if (!fs.existsSync(binary)) fs.copyFileSync(path.resolve(BINARY), binary);
  const child = spawn(
    binary,
    ["--addr", `127.0.0.1:${port}`, "--database-url", database, "--log", "warn"],
    { cwd: dir, stdio: ["ignore", "ignore", "pipe"] },
  );
  let stderr = "";
  child.stderr?.on("data", (chunk) => (stderr += chunk));
  const server = { process: child, stderr: () => stderr };
  await expect
    .poll(
      async () => {
        if (child.exitCode !== null || child.signalCode !== null) {
          return `exited (${child.exitCode ?? child.signalCode}): ${stderr}`;
        }
        return (await fetch(`${RESTARTED}/healthz`).catch(() => null))?.status ?? 0;
      },
      { message: "the server answers /healthz", timeout: 20_000 },
    )
    .toBe(200);
  return server;
}

/** Kills the server outright (SIGKILL: no shutdown, nothing flushed on the way out) and waits until it is gone. */
async function kill(server: Server) {
  const child = server.process;
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGKILL");
  await exited;
}

// Both tests start their server on the same port.
test.describe.configure({ mode: "serial" });

test("the server killed with a card pending and started again: the page reconnects by itself and the card still decides", async ({
  page,
}, testInfo) => {
  // Two starts of the server and a reconnection with backoff: more than the usual 30 s.
  test.setTimeout(90_000);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "toolgate-e2e-restart-"));
  let server: Server | undefined;
  try {
    server = await start(dir);
    const first = server.process.pid;
    // The connection's failures are the page's to handle: none escapes as an exception.
    const pageErrors: string[] = [];
    page.on("pageerror", (error) => pageErrors.push(error.message));
    await openPage(page, `${RESTARTED}/`);
    const file = unique("restart");
    await send(page, `write ${file}: survived`);
    const pending = card(page, "write_file");
    await expect(pending).toBeVisible();
    await expect(pending).toContainText(file);

    await kill(server);
    expect(server.process.signalCode).toBe("SIGKILL");
    await expect(page.locator(".connection")).toBeVisible();
    await screenshot(page, testInfo, "restart-server-down");

    server = await start(dir);
    expect(server.process.pid).not.toBe(first);

    // The page finds the server again on its own; the card is still there and still decides.
    await expect(page.locator(".connection")).toHaveCount(0, { timeout: 40_000 });
    await expect(pending).toBeVisible();
    await expect(pending).toContainText(file);
    await pending.getByRole("button", { name: "Approve", exact: true }).click();
    await expect(pending).toHaveCount(0);
    await expect(page.locator(".tool-call .badge")).toHaveText("approved · done");
    await expect(page.locator(".turn.assistant").last()).toHaveText(`write_file wrote 8 bytes to ${file}.`);
    expect(fs.readFileSync(path.join(dir, "workspace", file), "utf8")).toBe("survived");
    await screenshot(page, testInfo, "restart-decided");
    expect(pageErrors).toEqual([]);
  } finally {
    if (server) await kill(server);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

for (const pendingRefused of [false, true]) {
  test(`the memory store's server killed with a card pending: once it is back, the card is gone and the page can be used again${pendingRefused ? " (though its list of pending approvals fails)" : ""}`, async ({
    page,
  }, testInfo) => {
    test.setTimeout(90_000);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "toolgate-e2e-restart-memory-"));
    let server: Server | undefined;
    try {
      server = await start(dir, "memory");
      await openPage(page, `${RESTARTED}/`);
      await send(page, `delete ${unique("forgotten")}`);
      const pending = card(page, "delete_file");
      await expect(pending).toBeVisible();
      const box = page.getByLabel("Message", { exact: true });
      await expect(box).toBeDisabled();

      await kill(server);
      await expect(page.locator(".connection")).toBeVisible();
      // The server's answer that it does not hold the run is enough: the run's cards go with it.
      if (pendingRefused) await page.route("**/api/fn/pending", (route) => route.fulfill({ status: 503, body: "unavailable" }));
      // A new process with an empty memory: the approval, its run and its conversation went with the old one.
      server = await start(dir, "memory");
      await expect(page.locator(".connection")).toHaveCount(0, { timeout: 40_000 });
      await expect(pending).toHaveCount(0);
      await expect(page.locator(".tool-call .badge")).toHaveText("no longer held by the server");
      await expect(page.getByRole("button", { name: "Cancel the run" })).toHaveCount(0);
      await expect(box).toBeEnabled();
      if (pendingRefused) return;
      await screenshot(page, testInfo, "restart-memory-forgotten");
      await send(page, "list files");
      await expect(page.locator(".run").last().locator(".turn.assistant")).toHaveCount(1);
    } finally {
      if (server) await kill(server);
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
}

test("the memory store's server killed while an approved command runs: once it is back, the run no longer holds the page up", async ({
  page,
}, testInfo) => {
  test.setTimeout(90_000);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "toolgate-e2e-restart-memory-running-"));
  let server: Server | undefined;
  try {
    server = await start(dir, "memory");
    await openPage(page, `${RESTARTED}/`);
    await send(page, "run sleep 30");
    const pending = card(page, "run_command");
    await pending.getByRole("button", { name: "Approve", exact: true }).click();
    const badge = page.locator(".tool-call .badge");
    await expect(badge).toHaveText("approved · running");
    const box = page.getByLabel("Message", { exact: true });
    await expect(box).toBeDisabled();

    await kill(server);
    await expect(page.locator(".connection")).toBeVisible();
    // A new process with an empty memory: the run went with the old one, and no event will ever end it.
    server = await start(dir, "memory");
    await expect(page.locator(".connection")).toHaveCount(0, { timeout: 40_000 });
    await expect(page.locator(".run .turn.failed")).toContainText("The server no longer holds this run");
    await expect(badge).toHaveText("approved · no result: its run ended");
    await expect(page.getByRole("button", { name: "Cancel the run" })).toHaveCount(0);
    await expect(box).toBeEnabled();
    await screenshot(page, testInfo, "restart-memory-run-forgotten");
  } finally {
    if (server) await kill(server);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

for (const decidedMeanwhile of [false, true]) {
  test(`a machine crash that lost the server's last writes: the page, which saw past them, shows what the server holds again${decidedMeanwhile ? " (though the server wrote past them before the page was back)" : ""}`, async ({
    page,
  }, testInfo) => {
    test.setTimeout(90_000);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "toolgate-e2e-restart-lost-"));
    const snapshot = fs.mkdtempSync(path.join(os.tmpdir(), "toolgate-e2e-restart-lost-disk-"));
    const files = ["toolgate.db", "toolgate.db-wal"];
    let server: Server | undefined;
    try {
      server = await start(dir);
      await openPage(page, `${RESTARTED}/`);
      await send(page, "run sleep 30");
      const pending = card(page, "run_command");
      await expect(pending).toBeVisible();
      // What the disk holds while the card waits (nothing is being written): a power loss from here on may leave
      // the database as it is now, as SQLite's `synchronous = NORMAL` allows.
      for (const file of files) fs.copyFileSync(path.join(dir, file), path.join(snapshot, file));
      await pending.getByRole("button", { name: "Approve", exact: true }).click();
      const badge = page.locator(".tool-call .badge");
      await expect(badge).toHaveText("approved · running");

      // The machine goes down, and the writes since the snapshot with it: the approval is lost, and the run's log
      // ends before the events the page has seen.
      await kill(server);
      for (const file of files) fs.copyFileSync(path.join(snapshot, file), path.join(dir, file));
      fs.rmSync(path.join(dir, "toolgate.db-shm"), { force: true });
      let away = decidedMeanwhile;
      await page.route(/\/api\/agent\/sessions\/[^/]+\/events/, (route) => (away ? route.abort() : route.continue()));
      server = await start(dir);

      if (decidedMeanwhile) {
        // Before the page is back, the card the crash brought back is denied elsewhere, and the run goes on: its
        // log now has events under the numbers the page saw, other than the ones it saw.
        const listed = await (await fetch(`${RESTARTED}/api/agent/approvals`)).json();
        const { runId, toolCallId } = listed.pending[0];
        const decided = await fetch(`${RESTARTED}/api/agent/approvals/${runId}/${toolCallId}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ decision: "deny" }),
        });
        expect(decided.status).toBe(200);
        await expect
          .poll(async () => (await (await fetch(`${RESTARTED}/api/agent/runs/${runId}`)).json()).run.status)
          .toBe("done");
        away = false;
        await expect(badge).toHaveText("denied by you", { timeout: 40_000 });
        await expect(page.locator(".turn.assistant")).toHaveCount(1);
        return;
      }
      // The stream cannot bring the run as the server holds it (its new events would have numbers the page has
      // seen): the page shows it from the server, with its card waiting again.
      await expect(page.locator(".connection")).toHaveCount(0, { timeout: 40_000 });
      await expect(pending).toBeVisible();
      await expect(badge).toHaveText("waiting for approval");
      await screenshot(page, testInfo, "restart-lost-writes");
      await pending.getByRole("button", { name: "Deny", exact: true }).click();
      await expect(badge).toHaveText("denied by you");
    } finally {
      if (server) await kill(server);
      fs.rmSync(dir, { recursive: true, force: true });
      fs.rmSync(snapshot, { recursive: true, force: true });
    }
  });
}
