// One OpenAI Agents SDK (JavaScript) turn kept in sessionlog, with a stub model: no API key, no
// network. A model provider hands out the stub, which calls the `lookup` tool and then answers with
// what the tool returned; run() stores the turn (the question, the call, its result, the answer).
//
//   npm install /path/to/sessionlog-client-0.1.0.tgz @openai/agents
//   node openai-agents.mjs   # SESSIONLOG_SERVER=HOST:PORT, 127.0.0.1:50051 by default
import { Agent, Runner, tool, Usage } from "@openai/agents";
import { SessionLogClient } from "sessionlog-client";
import { SessionlogSession } from "sessionlog-client/openai-agents";

const SERVER = process.env.SESSIONLOG_SERVER ?? "127.0.0.1:50051";

/** The SDK's Model interface: calls `lookup` once, then answers with the tool's output. */
const stubModel = {
  async getResponse(request) {
    const last = Array.isArray(request.input) ? request.input.at(-1) : { content: request.input };
    const output =
      last.type === "function_call_result"
        ? [
            {
              type: "message",
              role: "assistant",
              id: "msg_1",
              status: "completed",
              content: [{ type: "output_text", text: last.output.text ?? last.output }],
            },
          ]
        : [{ type: "function_call", callId: "call_1", name: "lookup", arguments: '{"word":"LMDB"}', status: "completed" }];
    return { usage: new Usage(), output, responseId: undefined };
  },
  async *getStreamedResponse() {
    throw new Error("this example does not stream");
  },
};

const lookup = tool({
  name: "lookup",
  description: "Look a word up.",
  parameters: {
    type: "object",
    properties: { word: { type: "string" } },
    required: ["word"],
    additionalProperties: false,
  },
  strict: true,
  execute: async ({ word }) => `${word} is a memory-mapped B+tree store.`,
});

const runner = new Runner({ modelProvider: { getModel: () => stubModel }, tracingDisabled: true });
const agent = new Agent({ name: "helper", instructions: "Be brief.", model: "stub", tools: [lookup] });
const client = new SessionLogClient(SERVER);
const session = new SessionlogSession("openai-agents-ts-example", client);
await session.clearSession(); // a second run starts over (the log keeps the first)
const result = await runner.run(agent, "What is LMDB?", { session });
console.log(result.finalOutput);
console.log((await session.getItems()).map((item) => item.type ?? "message").join(" "));
console.log((await client.deriveMessages("openai-agents-ts-example")).messages.map((m) => m.role).join(" "));
client.close();
// -> LMDB is a memory-mapped B+tree store.
// -> message function_call function_call_result message
// -> user assistant tool assistant
