// LangGraph.js's own checkpointer conformance suite (@langchain/langgraph-checkpoint-validation:
// put, putWrites, getTuple, list, deleteThread, and the opt-in getDeltaChannelHistory specs) run
// against SessionlogSaver on a real `sessionlog serve`. Each checkpointer the suite makes gets a
// prefix of its own, so one's threads are invisible to the next (the suite's isolation rule).
import { deltaChannelHistoryTests, validate } from "@langchain/langgraph-checkpoint-validation";
import { SessionlogSaver } from "sessionlog-client/langgraph";

import { startServer } from "../server.mjs";

const WORKERS = Number(process.env.SESSIONLOG_TEST_WORKERS ?? 1);
let server;
let made = 0;

const initializer = {
  checkpointerName: "sessionlog-client/langgraph",
  beforeAllTimeout: 60_000,
  async beforeAll() {
    server = await startServer({ args: WORKERS >= 2 ? ["--workers", String(WORKERS)] : [] });
  },
  async afterAll() {
    await server?.stop();
    server?.remove();
  },
  createCheckpointer() {
    made += 1;
    return new SessionlogSaver(server.address, { prefix: `lg${process.pid}n${made}.` });
  },
  destroyCheckpointer(saver) {
    saver.close();
  },
};

validate(initializer);
deltaChannelHistoryTests(initializer);
