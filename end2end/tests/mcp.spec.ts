// A tool of an MCP server on the page: the card says which server it belongs to and how far that server is trusted,
// and shows each argument as text to read rather than as escaped JSON.
import { expect, test } from "@playwright/test";
import { WITH_MCP } from "../playwright.config";
import { card, openPage, screenshot, send } from "./helpers";

test("an MCP tool's card names its server and shows its arguments formatted", async ({ page }, testInfo) => {
  await openPage(page, `${WITH_MCP}/`);
  const servers = page.getByRole("region", { name: "MCP servers" });
  await expect(servers).toContainText("fixture");
  await expect(servers.locator('[data-server="fixture"]')).toHaveAttribute("data-state", "ready");

  await send(page, 'call mcp__fixture__echo {"text": "first line\\nsecond line"}');
  const pending = card(page, "mcp__fixture__echo");
  await expect(pending).toBeVisible();
  await expect(pending.locator(".origin")).toHaveText(
    "A tool of the MCP server fixture, untrusted: what it claims about its tools is not believed",
  );
  const preview = pending.locator(".preview.fields");
  await expect(preview.locator(".preview-title")).toHaveText("From the MCP server fixture");
  await expect(preview.locator("dt")).toHaveText(["text"]);
  // The string as itself, on two lines, not as "first line\nsecond line".
  expect(await preview.locator("dd pre").innerText()).toBe("first line\nsecond line");
  await expect(pending.getByText("Arguments as JSON")).toBeVisible();
  await screenshot(page, testInfo, "mcp-card");

  await pending.getByRole("button", { name: "Approve", exact: true }).click();
  await expect(pending).toHaveCount(0);
  await expect(page.locator(".tool-call .badge")).toHaveText("approved · done");
});

test("a tool whose name the model sees cut short shows its own name on the card", async ({ page, request }, testInfo) => {
  // A server name this long leaves no room for its tools' names: the model sees each as a digest.
  const server = "a-fixture-server-whose-name-is-long-enough-to-cut-tool-names";
  const listed = await (await request.get(`${WITH_MCP}/api/tools`)).json();
  const echo = listed.tools.find(
    (tool: { source: { mcp?: { server: string; tool: string } } }) =>
      tool.source.mcp?.server === server && tool.source.mcp.tool === "echo",
  );
  expect(echo.name).not.toContain("echo");

  await openPage(page, `${WITH_MCP}/`);
  await send(page, `call ${echo.name} {"text": "hi"}`);
  const pending = card(page, echo.name);
  await expect(pending.locator(".origin")).toHaveText(
    `A tool of the MCP server ${server}, named echo there, untrusted: what it claims about its tools is not believed`,
  );
  await screenshot(page, testInfo, "mcp-card-cut-name");
  await pending.getByRole("button", { name: "Deny", exact: true }).click();
  await expect(pending).toHaveCount(0);
});

test("an argument that is text but spells another value is shown quoted, so it never reads as that value", async ({ page }) => {
  await openPage(page, `${WITH_MCP}/`);
  await send(page, 'call mcp__fixture__echo {"text": "false"}');
  const pending = card(page, "mcp__fixture__echo");
  // The text "false", which a server may read as true (a string that is not empty): not the flag false.
  expect(await pending.locator(".preview.fields dd pre").innerText()).toBe('"false"');
  await pending.getByRole("button", { name: "Deny", exact: true }).click();
  await expect(pending).toHaveCount(0);
});
