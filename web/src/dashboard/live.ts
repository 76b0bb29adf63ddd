// The live lifecycle feed: the `lifecycleEvents` subscription over the stock `graphql-ws`
// client. The client sends the same subscribe payload again on every reconnect, so the
// payload's `after` is moved to each event's cursor as it arrives: after a network drop or a
// server restart the feed resumes from the last event it showed, with no gap, and no event is
// shown twice (a cursor already shown is dropped all the same). A subscription the server
// ends (its store failed for a moment) is started again from the same cursor.
import { createClient, type Client } from 'graphql-ws';

export interface LifecycleEvent {
  cursor: string;
  streamId: string;
  streamType: string;
  version: number;
  type: string;
  recordedAt: string;
  tenantId: string | null;
}

/** How the feed's connection stands, as the page shows it. */
export type LinkState =
  | { state: 'connecting' }
  | { state: 'live' }
  | { state: 'reconnecting'; attempt: number }
  | { state: 'failed'; message: string };

/** What the feed tells the page. */
export interface FeedHandlers {
  /** A new event, in log order, each once. */
  event(event: LifecycleEvent): void;
  /** The connection changed. */
  link(link: LinkState): void;
  /** Connected (again): what happened while it was not is in the lists, not in the feed,
   * until the first event arrives. */
  connected(): void;
  /** Every event the server delivered, repeats included (the browser tests count them). */
  delivered(count: number): void;
}

export interface Feed {
  /** Stops the subscription and closes the socket. */
  stop(): void;
}

const SUBSCRIPTION = `subscription Feed($after: String) {
  lifecycleEvents(after: $after) {
    cursor streamId streamType version type recordedAt tenantId
  }
}`;

/** Cursors remembered to drop a repeat: more than a resume could ever send again. */
const SEEN_MAX = 2_000;

/** Longest wait between two reconnection attempts. */
const RETRY_WAIT_MAX_MS = 5_000;

/** Close codes after which trying again cannot help (the token is refused or expired). */
const REFUSED = new Set([4401, 4403]);

/** Error codes of a subscription that starting it again cannot mend. */
const FOR_GOOD = new Set(['UNAUTHENTICATED', 'FORBIDDEN', 'BAD_USER_INPUT']);

/** Waits longer after each failed attempt, up to `RETRY_WAIT_MAX_MS`, with jitter so that
 * many dashboards do not come back at once. */
function backoff(attempt: number): Promise<void> {
  const ms = Math.min(RETRY_WAIT_MAX_MS, 250 * 2 ** attempt) * (0.5 + Math.random() / 2);
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Subscribes with `token`, telling `handlers` what happens. */
export function follow(token: string, handlers: FeedHandlers): Feed {
  const url = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/graphql/ws`;
  const seen = new Set<string>();
  const payload = { query: SUBSCRIPTION, variables: { after: null as string | null } };
  let attempt = 0;
  let delivered = 0;
  let stopped = false;
  let unsubscribe = () => {};
  const client: Client = createClient({
    url,
    connectionParams: { authorization: `Bearer ${token}` },
    lazy: false,
    keepAlive: 10_000,
    retryAttempts: Number.MAX_SAFE_INTEGER,
    // By default only a close is retried; a server that is down answers the next attempt
    // with an error event, which would end the feed. A dashboard keeps trying.
    shouldRetry: (event) => !(event instanceof CloseEvent && REFUSED.has(event.code)),
    retryWait: async (retries) => {
      attempt = retries + 1;
      if (!stopped) handlers.link({ state: 'reconnecting', attempt });
      await backoff(retries);
    },
    on: {
      connecting: () => {
        if (attempt === 0) handlers.link({ state: 'connecting' });
      },
      connected: () => {
        attempt = 0;
        handlers.link({ state: 'live' });
        handlers.connected();
      },
      closed: (event) => {
        if (stopped) return;
        const code = (event as CloseEvent | undefined)?.code;
        if (code !== undefined && REFUSED.has(code)) {
          handlers.link({ state: 'failed', message: 'The server refused the token; sign in again.' });
        } else {
          handlers.link({ state: 'reconnecting', attempt: Math.max(attempt, 1) });
        }
      },
    },
  });

  /** Subscribes from `payload`'s cursor; a subscription the server ends is started again. */
  const subscribe = (restarts: number) => {
    let failure: { code: string; message: string } | undefined;
    const again = async () => {
      if (stopped) return;
      handlers.link({ state: 'reconnecting', attempt: restarts + 1 });
      await backoff(restarts);
      if (!stopped) subscribe(restarts + 1);
    };
    unsubscribe = client.subscribe<{ lifecycleEvents: LifecycleEvent }>(payload, {
      next: ({ data, errors }) => {
        if (errors?.length) {
          const code = String(errors[0].extensions?.code ?? 'INTERNAL');
          failure = { code, message: errors[0].message };
          return;
        }
        const event = data?.lifecycleEvents;
        if (!event) return;
        restarts = 0;
        delivered += 1;
        handlers.delivered(delivered);
        // Where a reconnect resumes from.
        payload.variables.after = event.cursor;
        if (seen.has(event.cursor)) return;
        seen.add(event.cursor);
        if (seen.size > SEEN_MAX) seen.delete(seen.values().next().value as string);
        handlers.event(event);
      },
      error: (error) => {
        if (stopped) return;
        const message = error instanceof Error ? error.message : 'The feed ended.';
        handlers.link({ state: 'failed', message });
      },
      complete: () => {
        if (failure && FOR_GOOD.has(failure.code)) {
          handlers.link({ state: 'failed', message: failure.message });
          return;
        }
        void again();
      },
    });
  };
  subscribe(0);
  return {
    stop() {
      stopped = true;
      unsubscribe();
      void client.dispose();
    },
  };
}
