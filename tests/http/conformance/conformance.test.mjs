// The Durable Streams server conformance suite against CONFORMANCE_TEST_URL (the suite's
// CLI finds no tests from node_modules, so this one-line file runs it under `vitest run`).
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

runConformanceTests({ baseUrl: process.env.CONFORMANCE_TEST_URL })
