import { expect, test } from "@playwright/test";
import { INSTANCE_A, INSTANCE_B } from "../playwright.config";
import { card, openPage, screenshot, send } from "./helpers";

// Two toolgate instances on one PostgreSQL (serve-two.sh): the page is served by A and follows its session there,
// while the decision is made on B, as it happens behind a load balancer without sticky sessions.

test("a card shown by one instance is decided on another and the page sees the run finish", async ({
  page,
  request,
}, testInfo) => {
  await openPage(page, `${INSTANCE_A}/`);
  const file = `two-instances-${Date.now().toString(36)}.txt`;
  await send(page, `write ${file}: from B`);
  const pending = card(page, "write_file");
  await expect(pending).toBeVisible();

  // Instance B lists every pending approval of the service, this one included.
  let approval: { runId: string; toolCallId: string } | undefined;
  await expect
    .poll(async () => {
      const listed = await (await request.get(`${INSTANCE_B}/api/agent/approvals`)).json();
      approval = listed.pending.find(
        (entry: { toolName: string; arguments: { path?: string } }) =>
          entry.toolName === "write_file" && entry.arguments.path === file,
      );
      return approval !== undefined;
    })
    .toBe(true);

  const decided = await request.post(`${INSTANCE_B}/api/agent/approvals/${approval!.runId}/${approval!.toolCallId}`, {
    data: { decision: "approve" },
  });
  expect(decided.status()).toBe(200);

  // The page, still on A, sees the decision and the run's end.
  await expect(pending).toHaveCount(0);
  const call = page.locator(".tool-call", { hasText: "write_file" });
  await expect(call.locator(".badge")).toHaveText("approved · done");
  await expect(page.locator(".turn.assistant").last()).toHaveText(`write_file wrote 6 bytes to ${file}.`);
  await screenshot(page, testInfo, "two-instances-done");

  // The decision was made once: A refuses a second one with the approval API's 404.
  const again = await request.post(`${INSTANCE_A}/api/agent/approvals/${approval!.runId}/${approval!.toolCallId}`, {
    data: { decision: "approve" },
  });
  expect(again.status()).toBe(404);
  expect((await again.json()).error).toBe(
    `No pending approval found for run ${approval!.runId} and tool call ${approval!.toolCallId}. It may have already been resolved or timed out.`,
  );
});
