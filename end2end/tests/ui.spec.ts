import { expect, type Page, test } from "@playwright/test";
import { card, openPage, screenshot, send } from "./helpers";

function unique(name: string) {
  return `${name}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 6)}.txt`;
}

test("a person can decide with the keyboard alone", async ({ page }, testInfo) => {
  await openPage(page);
  await page.getByLabel("Message", { exact: true }).fill(`delete ${unique("keys")}`);
  await page.keyboard.press("Enter");
  const pending = card(page, "delete_file");
  // Focus moves to the new card (the card itself, so a stray Enter cannot approve anything)...
  await expect(pending).toBeFocused();
  await page.keyboard.press("Enter");
  await expect(pending).toBeVisible();
  // ...and the buttons are the next stops.
  await page.keyboard.press("Tab");
  await expect(pending.getByRole("button", { name: "Approve", exact: true })).toBeFocused();
  await screenshot(page, testInfo, "keyboard-focus");
  await page.keyboard.press("Tab");
  await expect(pending.getByRole("button", { name: "Approve for session" })).toBeFocused();
  await page.keyboard.press("Tab");
  await expect(pending.getByLabel("Reason (optional)")).toBeFocused();
  await page.keyboard.type("not by keyboard");
  await page.keyboard.press("Tab");
  await expect(pending.getByRole("button", { name: "Deny" })).toBeFocused();
  await page.keyboard.press("Enter");
  await expect(pending).toHaveCount(0);
  await expect(page.locator(".tool-call .resolution")).toHaveText("The user denied this tool call: not by keyboard");
  // The focus the card held goes on to the message box, not back to the top of the page.
  await expect(page.getByLabel("Message", { exact: true })).toBeFocused();
});

test("the focus of a card decided by keyboard comes to the message box once the run it let go on ends", async ({ page }) => {
  await openPage(page);
  await send(page, "run sleep 2");
  const pending = card(page, "run_command");
  await pending.getByRole("button", { name: "Approve", exact: true }).focus();
  await page.keyboard.press("Enter");
  await expect(pending).toHaveCount(0);
  // The box is disabled while the command runs: the focus waits on the note that says so, then comes to the box.
  await expect(page.locator("#composer-note")).toBeFocused();
  await expect(page.locator(".turn.assistant").last()).toContainText("run_command");
  await expect(page.getByLabel("Message", { exact: true })).toBeFocused();
});

test("a decision by keyboard that does not reach the server gives the focus back to its card", async ({ page }) => {
  await openPage(page);
  await send(page, `delete ${unique("unsent")}`);
  const pending = card(page, "delete_file");
  await page.route("**/api/fn/decide", (route) => route.abort("connectionrefused"));
  await pending.getByRole("button", { name: "Approve", exact: true }).focus();
  await page.keyboard.press("Enter");
  await expect(page.getByRole("alert")).toContainText("The decision may not have reached the server");
  // The button was disabled while the decision was on its way; the focus comes back to the card, not the page. (When
  // the refusal comes within the frame, Chromium has not yet moved the focus off the disabled button, and it stays
  // there, in the card: either way the person goes on from the card.)
  await expect.poll(() => pending.evaluate((card) => card.contains(document.activeElement))).toBe(true);
  await page.unroute("**/api/fn/decide");
  await pending.getByRole("button", { name: "Deny" }).click();
  await expect(pending).toHaveCount(0);
});

test("deciding one of two cards by keyboard hands the focus to the other", async ({ page }) => {
  await openPage(page);
  await send(page, `delete ${unique("first")} and delete ${unique("second")}`);
  const cards = page.locator(".approval-card");
  await expect(cards).toHaveCount(2);
  await cards.first().getByRole("button", { name: "Deny" }).focus();
  await page.keyboard.press("Enter");
  await expect(cards).toHaveCount(1);
  await expect(cards.first()).toBeFocused();
  await cards.first().getByRole("button", { name: "Deny" }).click();
  await expect(cards).toHaveCount(0);
});

test("the page reads well in a narrow window", async ({ page }, testInfo) => {
  await page.setViewportSize({ width: 375, height: 740 });
  await openPage(page);
  await send(page, `write ${unique("narrow")}: a and delete ${unique("narrow")}`);
  await expect(page.locator(".approval-card")).toHaveCount(2);
  // Nothing is wider than the screen.
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  expect(overflow).toBeLessThanOrEqual(0);
  // Every button a person can see (two compact cards keep their details, Always allow among them, folded).
  const buttons = await page.locator(".approval-card button:visible").all();
  expect(buttons.length).toBeGreaterThanOrEqual(8);
  for (const button of buttons) {
    const box = await button.boundingBox();
    expect(box!.x + box!.width).toBeLessThanOrEqual(375);
  }
  await screenshot(page, testInfo, "narrow-window");
});

test("a card's details keep their width in a 400 px window", async ({ page }, testInfo) => {
  await page.setViewportSize({ width: 400, height: 800 });
  await openPage(page);
  await send(page, "run ls -la /tmp/a/rather/long/path/that/goes/on");
  const pending = card(page, "run_command");
  await expect(pending).toBeVisible();
  // The arguments read as words, not a letter a line beside a long label.
  const args = pending.locator(".preview.command .args");
  await expect(args).toBeVisible();
  const box = await args.boundingBox();
  expect(box!.width).toBeGreaterThan(250);
  expect(box!.height).toBeLessThan(120);
  await screenshot(page, testInfo, "narrow-command-card");
  await pending.getByRole("button", { name: "Deny" }).click();
  await expect(pending).toHaveCount(0);
});

test("a message too long to send says so in view and stays in the box, and the longest one is sent in any script", async ({ page }, testInfo) => {
  await openPage(page);
  const long = "x".repeat(40_000);
  await page.getByLabel("Message", { exact: true }).fill(long);
  await page.getByRole("button", { name: "Send" }).click();
  const alert = page.getByRole("alert");
  await expect(alert).toContainText("The message is 39.1 KiB; a message may be at most 32.0 KiB. Nothing was sent.");
  await expect(alert).toBeInViewport();
  await expect(page.getByLabel("Message", { exact: true })).toHaveValue(long);
  await screenshot(page, testInfo, "message-too-long");

  // The longest message the API takes is sent in any script, though beyond plain ASCII it travels at three times
  // its size.
  await alert.getByRole("button", { name: "Dismiss" }).click();
  const cyrillic = "ж".repeat(16_384);
  await page.getByLabel("Message", { exact: true }).fill(cyrillic);
  await page.getByRole("button", { name: "Send" }).click();
  await expect(page.locator(".turn.user").last()).toHaveText(cyrillic);
  await expect(page.locator(".turn.assistant")).toHaveCount(1);
  await expect(page.getByRole("alert")).toHaveCount(0);
  await expect(page.getByLabel("Message", { exact: true })).toHaveValue("");
});

/** Four runs, one after the other: a transcript taller than a 500 px window, whose end the page follows. */
async function fourRuns(page: Page) {
  for (let i = 0; i < 4; i++) {
    await send(page, "list files");
    await expect(page.locator(".turn.assistant")).toHaveCount(i + 1);
  }
}

test("an error stays in view when the page is scrolled to its end", async ({ page }) => {
  await page.setViewportSize({ width: 1000, height: 500 });
  await openPage(page);
  await fourRuns(page);
  expect(await page.evaluate(() => document.documentElement.scrollHeight)).toBeGreaterThan(900);
  await page.route("**/api/fn/start_run", (route) => route.abort("connectionrefused"));
  await send(page, "list files");
  const alert = page.getByRole("alert");
  await expect(alert).toBeVisible();
  await expect(alert).toBeInViewport();
  await expect(alert).toContainText("The message was not sent: the server could not be reached");
});

test("sending brings the new run into view after scrolling up to read", async ({ page }) => {
  await page.setViewportSize({ width: 1000, height: 500 });
  await openPage(page);
  await fourRuns(page);
  await page.evaluate(() => window.scrollTo(0, 0));
  await expect(page.locator(".turn.assistant").last()).not.toBeInViewport();
  await send(page, "list files");
  await expect(page.locator(".turn.assistant")).toHaveCount(5);
  await expect(page.locator(".turn.assistant").last()).toBeInViewport();
});

test("at 400 px an error leaves the card's buttons usable, and a long grant wraps in the panel", async ({ page }, testInfo) => {
  await page.setViewportSize({ width: 400, height: 800 });
  await openPage(page);
  const long = "--a-very-long-option-name=value_without_any_spaces_0123456789012345678901234567890123456789";
  await send(page, `run echo ${long} /some/really/long/path/that/goes/on/and/on/forever.txt`);
  const pending = card(page, "run_command");
  await expect(pending).toBeVisible();
  await page.route("**/api/fn/decide", (route) => route.abort("connectionrefused"));
  await pending.getByRole("button", { name: "Deny" }).click();
  await expect(page.getByRole("alert")).toContainText("The decision may not have reached the server");
  // Nothing lies over the buttons (a trial click checks what receives it), and nothing is wider than the window.
  await pending.getByRole("button", { name: "Approve for session" }).click({ trial: true });
  expect(await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth)).toBeLessThanOrEqual(0);
  await screenshot(page, testInfo, "narrow-error-and-card");
  await page.unroute("**/api/fn/decide");
  await page.getByRole("alert").getByRole("button", { name: "Dismiss" }).click();
  await pending.getByRole("button", { name: "Approve for session" }).click();
  await expect(pending).toHaveCount(0);

  await page.locator(".rules-panel summary").click();
  const grant = page.locator(".rules-panel .grant");
  await expect(grant).toContainText("echo");
  expect(await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth)).toBeLessThanOrEqual(0);
  const revoke = grant.getByRole("button", { name: "Revoke" });
  await expect(revoke).toBeInViewport();
  const box = await revoke.boundingBox();
  expect(box!.x + box!.width).toBeLessThanOrEqual(400);
  await screenshot(page, testInfo, "narrow-long-grant");
  await revoke.click();
  await expect(grant).toHaveCount(0);
});

test("at 400 px a batch of cards leaves part of the conversation in view", async ({ page }, testInfo) => {
  await page.setViewportSize({ width: 400, height: 800 });
  await openPage(page);
  const n = Math.random().toString(36).slice(2, 8);
  await send(page, `write phone-a-${n}.txt: one and write phone-b-${n}.txt: two and delete phone-c-${n}.txt`);
  await expect(page.locator(".approval-card")).toHaveCount(3);
  // The cards, their batch buttons and the message box below them leave a fifth of the window to the conversation
  // (they took 757 px of 800, and the conversation could not be seen), while a whole card still fits (the test of
  // three cards in a narrow window checks that).
  const dock = await page.locator(".dock").boundingBox();
  expect(dock!.height).toBeLessThanOrEqual(640);
  await expect(page.getByRole("button", { name: "Approve all" })).toBeInViewport();
  await screenshot(page, testInfo, "narrow-batch");
  await page.getByRole("button", { name: "Deny all" }).click();
  await expect(page.locator(".approval-card")).toHaveCount(0);
});

test("a message that does not reach the server says so", async ({ page }, testInfo) => {
  await openPage(page);
  await page.route("**/api/fn/start_run", (route) => route.abort("connectionrefused"));
  await send(page, "list files");
  const alert = page.getByRole("alert");
  await expect(alert).toContainText("The message was not sent");
  await expect(page.getByLabel("Message", { exact: true })).toHaveValue("list files");
  await screenshot(page, testInfo, "unreachable");
  await alert.getByRole("button", { name: "Dismiss" }).click();
  await expect(page.getByRole("alert")).toHaveCount(0);
});

test("dismissing an error with the keyboard leaves the focus where the person acts", async ({ page }) => {
  await openPage(page);
  await page.route("**/api/fn/start_run", (route) => route.abort("connectionrefused"));
  await send(page, "list files");
  const alert = page.getByRole("alert");
  await expect(alert).toContainText("The message was not sent");
  await alert.getByRole("button", { name: "Dismiss" }).focus();
  await page.keyboard.press("Enter");
  await expect(page.getByRole("alert")).toHaveCount(0);
  await expect(page.getByLabel("Message", { exact: true })).toBeFocused();
});

test("a cancelled run says so, as an end a person chose rather than a failure", async ({ page }, testInfo) => {
  await openPage(page);
  await send(page, `delete ${unique("cancelled")}`);
  await expect(card(page, "delete_file")).toBeVisible();
  await page.getByRole("button", { name: "Cancel the run" }).click();
  await expect(card(page, "delete_file")).toHaveCount(0);
  await expect(page.locator(".turn.aborted")).toHaveText("The run was cancelled.");
  await expect(page.locator(".turn.failed")).toHaveCount(0);
  await expect(page.locator(".tool-call .badge")).toHaveText("aborted");
  // The run's `error` event is news about the run, not about the connection, which stays up.
  await expect(page.locator(".connection")).toHaveCount(0);
  await screenshot(page, testInfo, "run-cancelled");
});

test("the debug console shows each debug event with its time", async ({ page }) => {
  await openPage(page);
  await send(page, "list files");
  await expect(page.locator(".turn.assistant")).toHaveCount(1);
  await page.getByRole("button", { name: /Show debug console/ }).click();
  const entries = page.locator("#debug-log li");
  await expect(entries.first()).toContainText(/^\d\d:\d\d:\d\d\.\d\d\d step 1: asking the scripted model/);
  await expect(page.locator("#debug-log")).toContainText("list_files (call_1): allow: list_files is read-only.");
});
