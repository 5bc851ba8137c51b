// Interop: a real AG-UI client from npm (@ag-ui/client's HttpAgent) drives toolgate's /api/agui, including the
// interrupt and the resume. The client validates every event against the AG-UI schemas and their order.
import { expect, test } from "@playwright/test";
import { HttpAgent, type BaseEvent } from "@ag-ui/client";
import { MAIN } from "../playwright.config";

function agentFor(thread: string) {
  return new HttpAgent({ url: `${MAIN}/api/agui`, threadId: `${thread}-${Date.now().toString(36)}` });
}

function recorder() {
  const events: BaseEvent[] = [];
  return { events, subscriber: { onEvent: ({ event }: { event: BaseEvent }) => void events.push(event) } };
}

test("an AG-UI HttpAgent approves a call through an interrupt and a resume", async () => {
  const agent = agentFor("interop-approve");
  const file = `agui-${Date.now().toString(36)}.txt`;
  agent.addMessage({ id: "u1", role: "user", content: `write ${file}: hi` });
  const first = recorder();
  await agent.runAgent({}, first.subscriber);

  const types = first.events.map((event) => event.type);
  expect(types[0]).toBe("RUN_STARTED");
  expect(types.at(-1)).toBe("RUN_FINISHED");
  expect(agent.pendingInterrupts).toHaveLength(1);
  const [interrupt] = agent.pendingInterrupts;
  expect(interrupt.reason).toBe("tool_call");
  expect(interrupt.message).toBe("write_file is destructive.");
  expect(new Date(interrupt.expiresAt!).getTime()).toBeGreaterThan(Date.now());

  // The stock client sends no parentRunId: the server takes the thread's open interrupts as the parent.
  const second = recorder();
  await agent.runAgent(
    { resume: [{ interruptId: interrupt.id, status: "resolved", payload: { approved: true } }] },
    second.subscriber,
  );
  expect(agent.pendingInterrupts).toHaveLength(0);
  expect(second.events.map((event) => event.type)).toContain("TOOL_CALL_RESULT");
  const last = agent.messages.at(-1)!;
  expect(last.role).toBe("assistant");
  expect(last.content).toBe(`write_file wrote 2 bytes to ${file}.`);
});

test("an AG-UI HttpAgent denies with a reason, and the model is told", async () => {
  const agent = agentFor("interop-deny");
  agent.addMessage({ id: "u1", role: "user", content: "delete agui-keep.txt" });
  const first = recorder();
  await agent.runAgent({}, first.subscriber);
  const [interrupt] = agent.pendingInterrupts;
  const interrupted = first.events.find((event) => event.type === "RUN_FINISHED") as unknown as { runId: string };

  // A client that names the parent run (as TanStack AI's does) is checked against it.
  agent.use((input, next) => next.run({ ...input, parentRunId: interrupted.runId }));
  await agent.runAgent({
    resume: [{ interruptId: interrupt.id, status: "resolved", payload: { approved: false, reason: "keep it" } }],
  });
  const last = agent.messages.at(-1)!;
  expect(last.content).toBe(
    "delete_file was not run because it was denied: The user denied this tool call: keep it.",
  );
});

test("a resume naming a made-up parent run is refused, and the interrupt stays open for a true one", async () => {
  const agent = agentFor("interop-refused");
  const file = `agui-refused-${Date.now().toString(36)}.txt`;
  agent.addMessage({ id: "u1", role: "user", content: `write ${file}: x` });
  await agent.runAgent({});
  const [interrupt] = agent.pendingInterrupts;
  const approve = { resume: [{ interruptId: interrupt.id, status: "resolved" as const, payload: { approved: true } }] };

  const liar = agent.clone();
  liar.use((input, next) => next.run({ ...input, parentRunId: "run-made-up" }));
  await expect(liar.runAgent(approve)).rejects.toThrow(/404|UNKNOWN_PARENT_RUN/);

  await agent.runAgent(approve);
  expect(agent.messages.at(-1)!.content).toBe(`write_file wrote 1 byte to ${file}.`);
});
