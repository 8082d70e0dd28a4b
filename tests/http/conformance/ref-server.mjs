// The protocol's reference Node server with file storage, for the conformance and bench
// runs: `node ref-server.mjs DATA_DIR [LONG_POLL_MS]` listens on a free loopback port and
// prints its base URL on a line of its own when ready (after its log lines); SIGTERM, or
// its stdin ending, stops it.
import { DurableStreamTestServer } from "@durable-streams/server"

const dataDir = process.argv[2]
if (!dataDir) {
  console.error("usage: node ref-server.mjs DATA_DIR")
  process.exit(2)
}
const longPollTimeout = Number(process.argv[3] ?? 30000)
const server = new DurableStreamTestServer({
  port: 0,
  host: "127.0.0.1",
  dataDir,
  longPollTimeout,
})
const url = await server.start()
console.log(url)

const stop = async () => {
  await server.stop()
  process.exit(0)
}
process.on("SIGTERM", stop)
process.on("SIGINT", stop)
process.stdin.on("end", stop)
process.stdin.resume()
