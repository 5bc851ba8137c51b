import { expect, test } from "@playwright/test";
import { card, openPage, screenshot, send } from "./helpers";

/** A file name no other test uses: the rule this test adds covers only it, so parallel tests are unaffected. */
function unique(name: string) {
  return `${name}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 6)}.txt`;
}

test("Always allow shows the rule, adds it only once confirmed, and the same call then runs without a card", async ({
  page,
}, testInfo) => {
  await openPage(page);
  const file = unique("always");
  await send(page, `write ${file}: one`);
  const pending = card(page, "write_file");
  await expect(pending).toBeVisible();
  await expect(pending.locator(".scope-notes")).toContainText(
    "For the rest of this session, write_file runs without asking on any path in the workspace.",
  );

  // The confirmation shows the exact rule; cancelling adds nothing and leaves the card pending.
  await pending.getByRole("button", { name: "Always allow…" }).click();
  const confirm = pending.getByRole("group", { name: "Confirm the rule" });
  await expect(confirm.locator(".rule-text")).toHaveText(`write_file(${file})=allow`);
  await screenshot(page, testInfo, "always-allow-confirm");
  await confirm.getByRole("button", { name: "Cancel" }).click();
  await expect(confirm).toHaveCount(0);
  await expect(pending).toBeVisible();
  const rules = await (await page.request.get("/api/rules")).json();
  expect(rules.rules.map((r: { rule: string }) => r.rule)).not.toContain(`write_file(${file})=allow`);

  // Confirming adds the rule and approves the call.
  await pending.getByRole("button", { name: "Always allow…" }).click();
  await pending.getByRole("button", { name: "Add rule and approve" }).click();
  await expect(pending).toHaveCount(0);
  await expect(page.locator(".turn.assistant").last()).toHaveText(`write_file wrote 3 bytes to ${file}.`);

  // The same call runs without a card.
  await send(page, `write ${file}: again`);
  await expect(page.locator(".turn.assistant").last()).toHaveText(`write_file wrote 5 bytes to ${file}.`);
  await expect(page.locator(".approval-card")).toHaveCount(0);

  // The panel lists the rule as added, and removing it makes the call ask again.
  await page.locator(".rules-panel summary").click();
  const rule = page.locator(".rules-panel .rule", { hasText: `write_file(${file})=allow` });
  await expect(rule.locator(".origin")).toHaveText("added by a person");
  await screenshot(page, testInfo, "rules-panel");
  await rule.getByRole("button", { name: "Remove" }).click();
  await expect(rule).toHaveCount(0);
  await send(page, `write ${file}: three`);
  await expect(card(page, "write_file")).toBeVisible();
  await card(page, "write_file").getByRole("button", { name: "Deny" }).click();
  await expect(card(page, "write_file")).toHaveCount(0);
});

test("a command's card names what each session scope covers, in plain words", async ({ page }, testInfo) => {
  await openPage(page);
  const word = unique("scope").replace(/\.txt$/, "");
  await send(page, `run echo ${word}`);
  const pending = card(page, "run_command");
  await expect(pending).toBeVisible();
  await expect(pending.getByRole("button", { name: "Approve for session" })).toBeVisible();
  await expect(pending.getByRole("button", { name: "Approve “echo” with any arguments for session" })).toBeVisible();
  await expect(pending.locator(".scope-notes")).toContainText(
    `For the rest of this session, “echo ${word}” runs again without asking: the same program with the same arguments. Any other command still asks.`,
  );
  // The texts are for people: no markup shows through.
  expect(await pending.innerText()).not.toContain("`");
  await screenshot(page, testInfo, "command-scopes");
  await pending.getByRole("button", { name: "Deny" }).click();
  await expect(pending).toHaveCount(0);
});

test("approving for the session lists the grant in the panel at once, and revoking it there makes the call ask again", async ({
  page,
}, testInfo) => {
  await openPage(page);
  const file = unique("granted");
  await send(page, `write ${file}: one`);
  const pending = card(page, "write_file");
  await pending.getByRole("button", { name: "Approve for session" }).click();
  await expect(pending).toHaveCount(0);
  await expect(page.locator(".turn.assistant").last()).toHaveText(`write_file wrote 3 bytes to ${file}.`);

  // Without a reload: the panel reads the grants when it sees the approval, and the grant is there by then.
  await page.locator(".rules-panel summary").click();
  const grant = page.locator(".rules-panel .grant");
  await expect(grant).toHaveCount(1);
  await expect(grant).toContainText("write_file");
  await screenshot(page, testInfo, "grant-listed");
  await grant.getByRole("button", { name: "Revoke" }).click();
  await expect(grant).toHaveCount(0);
  await send(page, `write ${file}: two`);
  await expect(card(page, "write_file")).toBeVisible();
  await card(page, "write_file").getByRole("button", { name: "Deny" }).click();
  await expect(card(page, "write_file")).toHaveCount(0);
});

test("a conversation no longer among this browser's shows no grants in the panel and says why, not that there are none", async ({
  context,
  page,
}) => {
  await openPage(page);
  const file = unique("granted-unlisted");
  await send(page, `write ${file}: one`);
  const pending = card(page, "write_file");
  await pending.getByRole("button", { name: "Approve for session" }).click();
  await expect(pending).toHaveCount(0);
  // The browser's cookies no longer list the conversation this tab shows (as when 40 newer ones pushed it off).
  await context.clearCookies();
  await page.locator(".rules-panel summary").click();
  const panel = page.locator(".rules-panel");
  await expect(panel).toContainText("This conversation is no longer one of this browser's");
  await expect(panel).not.toContainText("Nothing is approved for this session.");
});

test("approving one card for the session approves the other cards it covers, says why, and leaves the rest", async ({
  page,
}, testInfo) => {
  await openPage(page);
  const [first, second, kept] = [unique("batch-one"), unique("batch-two"), unique("batch-kept")];
  await send(page, `write ${first}: one and write ${second}: two and delete ${kept}`);
  const writes = card(page, "write_file");
  await expect(writes).toHaveCount(2);
  await expect(card(page, "delete_file")).toBeVisible();

  await writes.filter({ hasText: first }).getByRole("button", { name: "Approve for session" }).click();
  // The grant covers write_file on any path, as both cards said: the second leaves with the first, unclicked.
  await expect(writes).toHaveCount(0);
  await expect(card(page, "delete_file")).toBeVisible();
  const covered = page.locator(".tool-call", { hasText: second });
  await expect(covered.locator(".resolution")).toHaveText(
    /^Covered by the approval for the session given to call \S+ \(write_file on any path in the workspace\)\.$/,
  );
  await screenshot(page, testInfo, "grant-covers-batch");

  await card(page, "delete_file").getByRole("button", { name: "Deny" }).click();
  const answer = page.locator(".turn.assistant").last();
  await expect(answer).toContainText(`write_file wrote 3 bytes to ${first}.`);
  await expect(answer).toContainText(`write_file wrote 3 bytes to ${second}.`);
  await expect(answer).toContainText("delete_file was not run because it was denied");

  // The audit log has each approval on a line of its own, and the call the covered one names is there to find.
  const given = (await covered.locator(".resolution").textContent())!.match(/given to call (\S+) /)![1];
  await page.getByRole("button", { name: "Audit log" }).click();
  const rows = page.locator(".audit tbody tr");
  const coveredRow = rows.filter({ hasText: `given to call ${given} ` });
  await expect(coveredRow).toHaveCount(1);
  await expect(coveredRow.locator(".outcome")).toHaveText("approved");
  const grantingRow = rows.filter({ has: page.locator("td.call-id code", { hasText: new RegExp(`^${given}$`) }) });
  await expect(grantingRow.filter({ hasText: "approved" }).locator(".scope")).toHaveText("session");
  await expect(grantingRow.filter({ hasText: "approved" }).locator("td.call-id code")).toHaveAttribute("title", given);
  await screenshot(page, testInfo, "grant-covers-batch-audit");
  // In a laptop's window (1280 px) every column is in view, and a reason reads as prose, not a word or two a line.
  const region = page.locator(".audit-scroll");
  expect(await region.evaluate((scroll) => scroll.scrollWidth - scroll.clientWidth)).toBeLessThanOrEqual(0);
  expect((await coveredRow.locator("td.reason").boundingBox())!.width).toBeGreaterThanOrEqual(200);
});

test("approving for the session leaves the cards this page is editing or writing a reason on", async ({ page }, testInfo) => {
  await openPage(page);
  const [first, edited, reasoned] = [unique("keep-one"), unique("keep-edited"), unique("keep-reasoned")];
  await send(page, `write ${first}: one and write ${edited}: model and write ${reasoned}: three`);
  const writes = card(page, "write_file");
  await expect(writes).toHaveCount(3);
  const editing = writes.filter({ hasText: edited });
  await editing.getByRole("button", { name: "Edit" }).click();
  await editing.getByLabel("content", { exact: true }).fill("person");
  // An edited card offers no approval for the session, and says why where the person edits.
  await expect(editing.getByRole("button", { name: "Approve for session" })).toBeDisabled();
  await expect(editing.getByRole("button", { name: "Approve for session" })).toHaveAccessibleDescription(
    /^Approving for the session is off while you edit/,
  );
  await expect(editing.getByRole("note").filter({ hasText: "while you edit" })).toHaveText(
    "Approving for the session is off while you edit: a grant covers calls as the card showed them, not as edited. Approve edited runs this call once.",
  );
  const reasoning = writes.filter({ hasText: reasoned });
  await reasoning.getByLabel("Reason (optional)").fill("not this one");

  await writes.filter({ hasText: first }).getByRole("button", { name: "Approve for session" }).click();
  await expect(writes.filter({ hasText: first })).toHaveCount(0);
  // The grant covers both others as their cards showed them, but the person is busy with them: they stay, as left.
  await expect(writes).toHaveCount(2);
  await expect(editing.getByLabel("content", { exact: true })).toHaveValue("person");
  await expect(reasoning.getByLabel("Reason (optional)")).toHaveValue("not this one");
  await screenshot(page, testInfo, "grant-leaves-busy-cards");

  await editing.getByRole("button", { name: "Approve edited" }).click();
  await reasoning.getByRole("button", { name: "Deny" }).click();
  const answer = page.locator(".turn.assistant").last();
  await expect(answer).toContainText(`write_file wrote 6 bytes to ${edited}.`);
  await expect(answer).toContainText("write_file was not run because it was denied: The user denied this tool call: not this one");
});

test("a grant revoked in another tab is gone from this tab's panel when it is opened again", async ({ context }, testInfo) => {
  const first = await context.newPage();
  const second = await context.newPage();
  await openPage(first);
  await openPage(second);
  const file = unique("elsewhere");
  await send(first, `write ${file}: one`);
  await card(first, "write_file").getByRole("button", { name: "Approve for session" }).click();
  await expect(first.locator(".turn.assistant").last()).toHaveText(`write_file wrote 3 bytes to ${file}.`);

  // Both tabs list the grant.
  await first.locator(".rules-panel summary").click();
  await second.locator(".rules-panel summary").click();
  await expect(first.locator(".rules-panel .grant")).toHaveCount(1);
  await expect(second.locator(".rules-panel .grant")).toHaveCount(1);
  await second.locator(".rules-panel summary").click();

  // Revoked in the second tab; the first tab's panel, closed and opened again, reads the grants again.
  await second.locator(".rules-panel summary").click();
  await second.locator(".rules-panel .grant").getByRole("button", { name: "Revoke" }).click();
  await expect(second.locator(".rules-panel .grant")).toHaveCount(0);
  await first.locator(".rules-panel summary").click();
  await first.locator(".rules-panel summary").click();
  await expect(first.locator(".rules-panel .grant")).toHaveCount(0);
  await expect(first.locator(".rules-panel")).toContainText("Nothing is approved for this session.");
  await screenshot(first, testInfo, "grant-revoked-elsewhere");
});

test("revoking grants with the keyboard keeps the focus in the list, and after the last on the panel", async ({ page }) => {
  await openPage(page);
  const words = ["focus-one", "focus-two", "focus-three"].map((name) => unique(name).replace(/\.txt$/, ""));
  for (const [i, word] of words.entries()) {
    await send(page, `run echo ${word}`);
    await card(page, "run_command").getByRole("button", { name: "Approve for session" }).click();
    await expect(card(page, "run_command")).toHaveCount(0);
    await expect(page.locator(".turn.assistant")).toHaveCount(i + 1);
  }
  await page.locator(".rules-panel summary").click();
  const grants = page.locator(".rules-panel .grant");
  await expect(grants).toHaveCount(3);
  const revoke = (word: string) => grants.filter({ hasText: word }).getByRole("button", { name: "Revoke" });

  // The last line's button goes with it: the focus goes to the line before.
  const shown = (await grants.allInnerTexts()).map((text) => text.match(/focus-\w+-[\w-]+/)![0]);
  await revoke(shown[2]).focus();
  await page.keyboard.press("Enter");
  await expect(grants).toHaveCount(2);
  await expect(revoke(shown[1])).toBeFocused();
  await page.keyboard.press("Enter");
  await expect(grants).toHaveCount(1);
  await expect(revoke(shown[0])).toBeFocused();
  // After the last grant, the panel's summary.
  await page.keyboard.press("Enter");
  await expect(grants).toHaveCount(0);
  await expect(page.locator(".rules-panel summary")).toBeFocused();
});

test("a rule's hidden characters are shown written out, a double click removes it once, and the audit view lists the rule's changes", async ({
  page,
}, testInfo) => {
  await openPage(page);
  const file = unique("hidden");
  // A right-to-left override in a glob would show the rule's text reversed from it on.
  const text = `read_file("${file}\u202E.txt")=deny`;
  const added = await page.request.post("/api/rules", { data: { rule: text } });
  expect(added.status()).toBe(201);
  const id = (await added.json()).rule.id;

  await page.locator(".rules-panel summary").click();
  const rule = page.locator(`.rules-panel .rule[data-rule-id="${id}"]`);
  await expect(rule.locator("code")).toContainText("\\u{202E}");
  await expect(rule.locator("code")).not.toContainText("\u202E");
  const remove = rule.getByRole("button", { name: "Remove the rule" });
  await expect(remove).toHaveAccessibleName(/^Remove the rule read_file\(/);
  const removals: Promise<unknown>[] = [];
  page.on("request", (request) => {
    if (request.url().includes("/api/fn/remove_rule")) removals.push(request.response());
  });
  await remove.dblclick();
  await expect(rule).toHaveCount(0);
  await Promise.all(removals);
  expect(removals).toHaveLength(1);
  await expect(page.locator(".error-banner")).toHaveCount(0);

  // A double click whose second click comes once the list was read again (a fast server) would land on the line
  // that took the removed one's place: it is not a click on that line.
  const more: string[] = [];
  for (const name of ["aa", "bb"]) {
    const added = await page.request.post("/api/rules", { data: { rule: `read_file("${unique(name)}\u202E.txt")=deny` } });
    expect(added.status()).toBe(201);
    more.push((await added.json()).rule.id);
  }
  await page.locator(".rules-panel summary").click();
  await page.locator(".rules-panel summary").click();
  const first = page.locator(".rules-panel .rule", { hasText: "aa-" });
  const box = (await first.getByRole("button").boundingBox())!;
  const [x, y] = [box.x + box.width / 2, box.y + box.height / 2];
  await page.mouse.click(x, y);
  await expect(first).toHaveCount(0);
  const underneath = await page.evaluate(
    ([x, y]) => document.elementFromPoint(x, y)?.closest("li.rule")?.getAttribute("data-rule-id"),
    [x, y],
  );
  expect(underneath, "a line took the removed one's place").toBeTruthy();
  await page.mouse.down({ clickCount: 2 });
  await page.mouse.up({ clickCount: 2 });
  // The audit view's read goes out after whatever that click sent.
  await page.getByRole("button", { name: "Audit log" }).click();
  await expect(page.locator(".audit tbody tr").first()).toBeVisible();
  await Promise.all(removals);
  expect(removals).toHaveLength(2);
  await expect(page.locator(`.rules-panel .rule[data-rule-id="${underneath}"]`)).toHaveCount(1);
  // The rule that stayed goes, with this test.
  expect((await page.request.delete(`/api/rules/${more[1]}`)).status()).toBe(200);

  // The audit view of a server without a token shows every browser the rule's changes (they belong to no
  // conversation, and the panel lists the rules for everybody anyway), hidden characters written out.
  const changes = page.locator(".audit tbody tr", { hasText: file });
  await expect(changes).toHaveCount(2);
  await expect(changes.locator(".outcome")).toHaveText(["removed", "added"]);
  await expect(changes.first().locator(".reason")).toContainText("\\u{202E}");
  await screenshot(page, testInfo, "audit-rule-changes");
  await page.getByLabel("Outcome").selectOption("added");
  await page.getByRole("button", { name: "Show", exact: true }).click();
  await expect(changes).toHaveCount(1);

  // A run id that cannot be one is said to be wrong, not read as no filter.
  await page.getByLabel("Run", { exact: true }).fill("run 1");
  await page.getByRole("button", { name: "Show", exact: true }).click();
  await expect(page.getByRole("alert")).toContainText("“run 1” is not a run id");
});

test("approving for the session leaves a card whose denial is on its way", async ({ page }) => {
  await openPage(page);
  const [first, denied] = [unique("inflight-one"), unique("inflight-denied")];
  await send(page, `write ${first}: one and write ${denied}: two`);
  const writes = card(page, "write_file");
  await expect(writes).toHaveCount(2);
  // The denial is held on its way until the approval for the session, clicked after it, has been decided.
  let release = () => {};
  const held = new Promise<void>((resolve) => (release = resolve));
  await page.route("**/api/fn/decide", async (route) => {
    if ((route.request().postData() ?? "").includes("choice=Deny")) await held;
    await route.continue();
  });
  await writes.filter({ hasText: denied }).getByRole("button", { name: "Deny" }).click();
  const approved = page.waitForResponse(
    (response) => response.url().endsWith("/api/fn/decide") && (response.request().postData() ?? "").includes("ApproveForSession"),
  );
  await writes.filter({ hasText: first }).getByRole("button", { name: "Approve for session" }).click();
  expect((await approved).status()).toBe(200);
  release();
  await expect(writes).toHaveCount(0);
  const answer = page.locator(".turn.assistant").last();
  await expect(answer).toContainText(`write_file wrote 3 bytes to ${first}.`);
  await expect(answer).toContainText("write_file was not run because it was denied");
  await expect(page.getByRole("alert")).toHaveCount(0);
});
