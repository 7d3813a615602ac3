// Type-checked by `npm run typecheck` (tsc, no emit; never run): SessionlogSession is the
// OpenAI Agents SDK's Session, as a TypeScript worker passes it to run().
import { Agent, type AgentInputItem, run, type Session, type SessionHistoryTransactionAwareSession } from "@openai/agents";
import { SessionLogClient } from "sessionlog-client";
import { SessionlogSession } from "sessionlog-client/openai-agents";

export async function turn(target: string): Promise<AgentInputItem[]> {
  const client = new SessionLogClient(target);
  const session: Session = new SessionlogSession("typed-agent", client);
  try {
    await run(new Agent({ name: "helper" }), "hi", { session });
    const latest: AgentInputItem[] = await session.getItems(2);
    const popped: AgentInputItem | undefined = await session.popItem();
    if (popped !== undefined) latest.push(popped);
    await session.clearSession();
    return latest;
  } finally {
    client.close();
  }
}

export async function transact(client: SessionLogClient): Promise<void> {
  const session: SessionHistoryTransactionAwareSession = new SessionlogSession("typed-tx", client);
  const items: AgentInputItem[] = [{ role: "user", content: "hi" }];
  await session.applyHistoryTransaction({ operationId: "op-1", transaction: { type: "append_items", items } });
  await session.applyHistoryTransaction({
    operationId: "op-2",
    transaction: { type: "replace_suffix", expectedSuffix: items, replacement: [] },
  });
}

export function owned(target: string[]): string {
  const session = new SessionlogSession("owned", target, { timeoutMs: 5_000 });
  session.close();
  return session.sessionId;
}
