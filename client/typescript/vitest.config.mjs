// Vitest runs only LangGraph's conformance suite (@langchain/langgraph-checkpoint-validation is
// written for it: its specs use Vitest's globals). The client's own tests use node's test runner.
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/vitest/*.test.mjs"],
    globals: true,
    fileParallelism: false,
    testTimeout: 30_000,
    hookTimeout: 60_000,
  },
});
