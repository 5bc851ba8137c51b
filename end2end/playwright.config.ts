import { defineConfig } from "@playwright/test";
import * as path from "node:path";
import { CHROMIUM, CHROMIUM_ARGS } from "./chromium.mjs";

// The binary under test: the release build by default, the one `make test` builds.
export const BINARY = process.env.TOOLGATE_BIN ?? "../target/release/toolgate";

/** The main server, and one with a short approval timeout for the timeout test. */
export const MAIN = "http://127.0.0.1:3100";
export const SHORT_TIMEOUT = "http://127.0.0.1:3101";
/** A server that needs an access token (security.spec.ts logs in to it). */
export const WITH_TOKEN = "http://127.0.0.1:3102";
/** A server with an MCP server's tools: toolgate's own fixture server (mcp.spec.ts). */
export const WITH_MCP = "http://127.0.0.1:3104";
/** A server a test starts, stops and starts again itself (restart.spec.ts). */
export const RESTARTED = "http://127.0.0.1:3103";
export const E2E_TOKEN = "e2e-4f8b2c6d1a9e7f3b5c0d8e2a6f4b1c9d";
/** Two instances on one PostgreSQL (instances.spec.ts). */
export const INSTANCE_A = "http://127.0.0.1:3110";
export const INSTANCE_B = "http://127.0.0.1:3111";

export default defineConfig({
  testDir: "./tests",
  timeout: 30_000,
  expect: { timeout: 10_000 },
  fullyParallel: true,
  workers: 2,
  retries: 0,
  reporter: "list",
  outputDir: "test-results",
  use: {
    baseURL: MAIN,
    trace: "retain-on-failure",
    screenshot: "only-on-failure",
  },
  projects: [
    {
      name: "chromium",
      use: {
        browserName: "chromium",
        launchOptions: { executablePath: CHROMIUM, args: CHROMIUM_ARGS },
      },
    },
  ],
  webServer: [
    {
      command: `./serve.sh ${BINARY} 3100 --log warn`,
      url: `${MAIN}/healthz`,
      reuseExistingServer: false,
      timeout: 60_000,
      stdout: "pipe",
    },
    {
      command: `./serve.sh ${BINARY} 3101 --approval-timeout-secs 3 --log warn`,
      url: `${SHORT_TIMEOUT}/healthz`,
      reuseExistingServer: false,
      timeout: 60_000,
    },
    {
      command: `./serve.sh ${BINARY} 3102 --log warn`,
      env: { TOOLGATE_TOKEN: E2E_TOKEN },
      url: `${WITH_TOKEN}/healthz`,
      reuseExistingServer: false,
      timeout: 60_000,
    },
    {
      // The second instance starts after the first answers, so its health means both are up.
      command: `./serve-two.sh ${BINARY} 3110 3111 --log warn`,
      url: `${INSTANCE_B}/healthz`,
      reuseExistingServer: false,
      timeout: 90_000,
      // SIGTERM, so that the script stops both instances and PostgreSQL and removes its directory.
      gracefulShutdown: { signal: "SIGTERM", timeout: 15_000 },
    },
    {
      // The fixture needs tools/mcp/node_modules, which scripts/bootstrap.sh installs.
      command: `./serve.sh ${BINARY} 3104 --mcp-config ${path.resolve(__dirname, "mcp.e2e.json")} --log warn`,
      env: { TOOLGATE_E2E_MCP_FIXTURE: path.resolve(__dirname, "../tools/mcp/misbehaving-server.mjs") },
      url: `${WITH_MCP}/healthz`,
      reuseExistingServer: false,
      timeout: 60_000,
    },
  ],
});
