// The npm `graphql-ws` client, as a dashboard would use it: subscribe with a token in
// connectionParams, keep the last cursor in the subscription's variables (the client re-sends
// that payload object on every reconnect), and resume after the server restarts (it closes
// sockets with 1012, which the client retries).
//
// node resume.mjs WS_URL TOKEN AFTER_CURSOR TOTAL
// Prints one JSON line per event ({streamId, cursor, type}), then {"done": true, "connects": N}.
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';

const [url, token, after, total] = process.argv.slice(2);
const SUBSCRIPTION = `subscription($after: String) {
  lifecycleEvents(after: $after) { cursor streamId type }
}`;

let connects = 0;
let received = 0;
const payload = { query: SUBSCRIPTION, variables: { after } };
const client = createClient({
  url,
  webSocketImpl: WebSocket,
  connectionParams: { authorization: `Bearer ${token}` },
  // The server is down while it restarts: about a second, many more on a loaded machine.
  // The test bounds the whole run, so keep retrying (up to ten minutes).
  retryAttempts: 6000,
  // By default the client retries only after a close event: a reconnect attempt that finds
  // the server still down (ECONNREFUSED arrives as an error event first) would end the
  // subscription for good. A dashboard keeps trying.
  shouldRetry: () => true,
  retryWait: () => new Promise((resolve) => setTimeout(resolve, 100)),
  on: { connected: () => { connects += 1; } },
});

await new Promise((resolve, reject) => {
  client.subscribe(payload, {
    next: ({ data, errors }) => {
      if (errors) {
        reject(new Error(JSON.stringify(errors)));
        return;
      }
      const event = data.lifecycleEvents;
      payload.variables.after = event.cursor;
      console.log(JSON.stringify(event));
      received += 1;
      if (received >= Number(total)) resolve();
    },
    error: (error) => reject(error instanceof Error ? error : new Error(JSON.stringify(error))),
    complete: resolve,
  });
});
console.log(JSON.stringify({ done: true, connects }));
await client.dispose();
process.exit(0);
