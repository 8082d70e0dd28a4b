// The official TypeScript client reads a JSON stream's catch-up, then tails it live from
// the offset the catch-up ended at, for tests/test_http_conformance.py:
//
//   node tail.mjs URL TOTAL LIVE_MODE
//
// LIVE_MODE is "sse" or "long-poll". It prints one JSON object a line on stdout:
//   {"catchup": [items...], "offset": "..."}   the catch-up (live: false), then
//   {"tailing": "..."}                           the live read starts at that offset, then
//   {"items": [items...], "offset": "..."}       each live batch that holds items,
// and exits 0 once it has seen TOTAL items in all (the test appends the rest meanwhile).
// A failure is a line {"error": "..."} and exit 1.
import { stream } from "@durable-streams/client"

const [url, totalArg, live] = process.argv.slice(2)
const total = Number(totalArg)
if (!url || !Number.isInteger(total) || (live !== "sse" && live !== "long-poll")) {
  console.error("usage: node tail.mjs URL TOTAL sse|long-poll")
  process.exit(2)
}
const say = (obj) => process.stdout.write(JSON.stringify(obj) + "\n")
const fail = (err) => {
  say({ error: String(err?.stack ?? err) })
  process.exit(1)
}

try {
  const catchup = await stream({ url, live: false, onError: fail })
  const items = await catchup.json()
  say({ catchup: items, offset: catchup.offset })

  let seen = items.length
  if (seen >= total) process.exit(0)
  say({ tailing: catchup.offset })
  const tail = await stream({ url, offset: catchup.offset, live, onError: fail })
  tail.subscribeJson(async (batch) => {
    if (batch.items.length === 0) return
    say({ items: batch.items, offset: batch.offset })
    seen += batch.items.length
    if (seen >= total) process.exit(0)
  })
} catch (err) {
  fail(err)
}
