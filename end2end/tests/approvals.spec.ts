import { expect, test } from "@playwright/test";
import { SHORT_TIMEOUT } from "../playwright.config";
import { card, openPage, screenshot, send } from "./helpers";

/** A file name no other test uses, so tests can share the server's workspace. */
function unique(name: string) {
  return `${name}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 6)}.txt`;
}

test("approving a card runs the tool and the run reaches its final answer", async ({ page }, testInfo) => {
  await openPage(page);
  const file = unique("notes");
  await send(page, `write ${file}: hello`);

  const pending = card(page, "write_file");
  await expect(pending).toBeVisible();
  await expect(pending).toBeFocused();
  await expect(pending.locator(".reason")).toHaveText("write_file is destructive.");
  await expect(pending.getByLabel("Arguments")).toContainText(`"path": "${file}"`);
  await expect(pending.locator(".countdown")).toHaveText(/^[12]:\d\d left$/);
  await screenshot(page, testInfo, "approve-card");

  await pending.getByRole("button", { name: "Approve", exact: true }).click();
  await expect(pending).toHaveCount(0);
  const call = page.locator(".tool-call", { hasText: "write_file" });
  await expect(call.locator(".badge")).toHaveText("approved · done");
  await expect(page.locator(".turn.assistant").last()).toHaveText(`write_file wrote 5 bytes to ${file}.`);
  await expect(page.getByLabel("Message", { exact: true })).toBeEnabled();
  await screenshot(page, testInfo, "approve-done");
});

test("denying with a reason tells the model, and the answer shows it", async ({ page }, testInfo) => {
  await openPage(page);
  const file = unique("keep");
  await send(page, `delete ${file}`);
  const pending = card(page, "delete_file");
  await expect(pending).toBeVisible();
  await pending.getByLabel("Reason (optional)").fill("that file is the only copy");
  await screenshot(page, testInfo, "deny-card");
  await pending.getByRole("button", { name: "Deny" }).click();

  await expect(pending).toHaveCount(0);
  const call = page.locator(".tool-call", { hasText: "delete_file" });
  await expect(call.locator(".badge")).toHaveText("denied by you");
  await expect(call.locator(".resolution")).toHaveText("The user denied this tool call: that file is the only copy");
  await expect(page.locator(".turn.assistant").last()).toHaveText(
    "delete_file was not run because it was denied: The user denied this tool call: that file is the only copy.",
  );
  await screenshot(page, testInfo, "deny-done");
});

test("two parallel approvals get two cards, each resolved on its own", async ({ page }, testInfo) => {
  await openPage(page);
  const [a, b] = [unique("a"), unique("b")];
  await send(page, `write ${a}: A and delete ${b}`);
  const write = card(page, "write_file");
  const del = card(page, "delete_file");
  await expect(write).toBeVisible();
  await expect(del).toBeVisible();
  await expect(page.locator(".approval-card")).toHaveCount(2);
  await screenshot(page, testInfo, "parallel-cards");

  await del.getByRole("button", { name: "Deny" }).click();
  await expect(del).toHaveCount(0);
  await expect(write).toBeVisible();
  await expect(page.getByLabel("Message", { exact: true })).toBeDisabled();

  await write.getByRole("button", { name: "Approve", exact: true }).click();
  await expect(page.locator(".approval-card")).toHaveCount(0);
  const answer = page.locator(".turn.assistant").last();
  await expect(answer).toContainText(`write_file wrote 1 byte to ${a}.`);
  await expect(answer).toContainText("delete_file was not run because it was denied: The user denied this tool call.");
  await screenshot(page, testInfo, "parallel-done");
});

test("a reload while an approval is pending shows the same card, then still works", async ({ page }, testInfo) => {
  await openPage(page);
  await send(page, `delete ${unique("reload")}`);
  await expect(card(page, "delete_file")).toBeVisible();

  await page.reload();
  // Server-rendered: the card is there before the WASM is.
  await expect(card(page, "delete_file")).toBeVisible();
  await expect(page.locator(".page")).toHaveAttribute("data-hydrated", "true");
  await expect(page.locator(".run")).toHaveCount(1);
  await expect(page.locator(".tool-call")).toHaveCount(1);
  await screenshot(page, testInfo, "reload-pending");

  await card(page, "delete_file").getByRole("button", { name: "Approve", exact: true }).click();
  await expect(page.locator(".approval-card")).toHaveCount(0);
  await expect(page.locator(".turn.assistant")).toHaveCount(1);
  await expect(page.locator(".run")).toHaveCount(1);
  await expect(page.locator(".tool-call")).toHaveCount(1, { timeout: 1000 });
});

test("a decision through the REST route removes the card in the open page", async ({ page, request }, testInfo) => {
  await openPage(page);
  await send(page, `delete ${unique("rest")}`);
  const pending = card(page, "delete_file");
  await expect(pending).toBeVisible();
  const runId = await page.locator(".run").last().getAttribute("data-run-id");
  const callId = await pending.getAttribute("data-tool-call-id");

  const response = await request.post(`/api/agent/approvals/${runId}/${callId}`, {
    data: { decision: "deny", reason: "decided from a script" },
  });
  expect(response.status()).toBe(200);
  await expect(pending).toHaveCount(0);
  await expect(page.locator(".tool-call .badge")).toHaveText("denied by you");
  await screenshot(page, testInfo, "rest-decided");
});

test("a decision in another tab removes the card in every tab", async ({ context }, testInfo) => {
  const first = await context.newPage();
  const second = await context.newPage();
  await openPage(first);
  await openPage(second);
  // The run starts in the first tab; the second tab, open already, follows the same session.
  await first.bringToFront();
  await send(first, `delete ${unique("tabs")}`);
  await expect(card(first, "delete_file")).toBeVisible();

  // The person switches to the second tab: the card is there too, and they decide it there.
  await second.bringToFront();
  await expect(card(second, "delete_file")).toBeVisible();
  await screenshot(second, testInfo, "tabs-second-sees-card");
  await card(second, "delete_file").getByRole("button", { name: "Approve", exact: true }).click();
  await expect(card(second, "delete_file")).toHaveCount(0);

  // Back in the first tab, the card is gone and the call shows as approved.
  await first.bringToFront();
  await expect(card(first, "delete_file")).toHaveCount(0);
  await expect(first.locator(".tool-call .badge")).toHaveText("approved · failed · NOT_FOUND");
});

test("an edit in one tab is said to be lost when another tab decides the call", async ({ context }, testInfo) => {
  const first = await context.newPage();
  const second = await context.newPage();
  await openPage(first);
  await openPage(second);
  await first.bringToFront();
  await send(first, `write ${unique("overtaken")}: one`);
  const editing = card(first, "write_file");
  await editing.getByRole("button", { name: "Edit" }).click();
  const editor = editing.getByRole("group", { name: "Edit the arguments" });
  await expect(editor).toBeVisible();
  // A look at the audit log and back keeps the card as it was, its edit open; nothing was settled, so nothing is said.
  await first.getByRole("button", { name: "Audit log" }).click();
  await expect(editing).toBeHidden();
  await first.getByRole("button", { name: "Audit log" }).click();
  await expect(editor).toBeVisible();
  await expect(first.getByRole("alert")).toHaveCount(0);

  await second.bringToFront();
  await card(second, "write_file").getByRole("button", { name: "Deny" }).click();
  await expect(card(second, "write_file")).toHaveCount(0);
  // The second tab sent its own decision: it has nothing to be told.
  await expect(second.getByRole("alert")).toHaveCount(0);

  await first.bringToFront();
  await expect(editing).toHaveCount(0);
  await expect(first.getByRole("alert")).toContainText(
    "The call of write_file you were editing was settled elsewhere (another tab, a timeout or the end of its run); your edit was not sent.",
  );
  await screenshot(first, testInfo, "edit-overtaken");
});

test("the send box is disabled, with the reason shown, while a card is open", async ({ page }, testInfo) => {
  await openPage(page);
  const box = page.getByLabel("Message", { exact: true });
  await expect(box).toBeEnabled();
  await send(page, `delete ${unique("blocked")}`);
  await expect(card(page, "delete_file")).toBeVisible();
  await expect(box).toBeDisabled();
  await expect(page.getByRole("button", { name: "Send" })).toBeDisabled();
  await expect(page.locator("#composer-note")).toContainText(
    "Decide the pending approval above before sending a new message.",
  );
  await screenshot(page, testInfo, "send-disabled");
  await card(page, "delete_file").getByRole("button", { name: "Deny" }).click();
  await expect(box).toBeEnabled();
});

test("a card nobody decides times out and says so in the transcript", async ({ page }, testInfo) => {
  await openPage(page, `${SHORT_TIMEOUT}/`);
  await send(page, `delete ${unique("timeout")}`);
  const pending = card(page, "delete_file");
  await expect(pending).toBeVisible();
  await expect(pending.locator(".countdown")).toHaveText(/^0:0[0-3] left$|^timing out…$/);
  await screenshot(page, testInfo, "timeout-card");
  await expect(pending).toHaveCount(0, { timeout: 8000 });
  await expect(page.locator(".tool-call .badge")).toHaveText("timed out");
  await expect(page.locator(".turn.assistant").last()).toContainText("No decision arrived within 3 s");
  await screenshot(page, testInfo, "timeout-done");
});
