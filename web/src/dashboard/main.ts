// The dashboard: sign in by pasting a token, then the live lifecycle feed and, by role, a
// tenant's workloads and quotas or an operator's lag, hosts and dead letters. Lists are read
// again when the feed shows something happened (as of that event's cursor); only the lag,
// which no subscription carries, is read on a timer.
import './style.css';
import { ApiError } from './api';
import { byId, debounce } from './dom';
import { showEvent, showLink } from './feed';
import { follow, type Feed, type LifecycleEvent } from './live';
import { refreshFleet, refreshLag } from './operator';
import { NotAToken, forget, keep, sessionOf, stored, type Session } from './session';
import { refreshTenant } from './tenant';

/** How often an operator's lag is read. */
const LAG_EVERY_MS = 5_000;

/** How long after an event the lists are read again (events come in bursts). */
const REFRESH_AFTER_MS = 250;

/** How long to wait before asking again when the read models were not there yet. */
const STALE_RETRY_MS = 1_000;

let running: { feed: Feed; timers: number[] } | undefined;

function signIn(session: Session): void {
  keep(session);
  byId('sign-in').hidden = true;
  byId('dashboard').hidden = false;
  byId('sign-out').hidden = false;
  byId('who').textContent =
    session.role === 'tenant' ? `tenant ${session.tenant ?? '?'} (${session.subject})` : `${session.role} ${session.subject}`;
  const tenant = session.role === 'tenant';
  const operator = session.role === 'operator';
  byId('tenant-views').hidden = !tenant;
  byId('operator-views').hidden = !operator;

  let lastCursor: string | undefined;
  const read = oneAtATime(() => readLists(session, () => lastCursor));
  const refresh = debounce(read, REFRESH_AFTER_MS);
  const onEvent = (event: LifecycleEvent) => {
    lastCursor = event.cursor;
    showEvent(event);
    refresh();
  };
  const feed = follow(session.token, onEvent, showLink);
  const timers: number[] = [];
  read();
  if (operator) {
    const lag = () => void refreshLag(session.token).catch(report);
    lag();
    timers.push(window.setInterval(lag, LAG_EVERY_MS));
  }
  running = { feed, timers };
}

/** `work` never running twice at once (an older answer cannot overwrite a newer one): a call
 * while it runs makes it run once more after. */
function oneAtATime(work: () => Promise<void>): () => void {
  let running = false;
  let again = false;
  const run = () => {
    if (running) {
      again = true;
      return;
    }
    running = true;
    void work().finally(() => {
      running = false;
      if (again) {
        again = false;
        run();
      }
    });
  };
  return run;
}

/** Reads the role's lists as of the last event shown; asks again while they lag behind it. */
async function readLists(session: Session, cursor: () => string | undefined): Promise<void> {
  const minCursor = cursor();
  try {
    if (session.role === 'tenant') await refreshTenant(session.token, minCursor);
    if (session.role === 'operator') await refreshFleet(session.token, minCursor);
    byId('problem').textContent = '';
  } catch (error) {
    if (error instanceof ApiError && (error.code === 'STALE' || error.code === 'UNAVAILABLE')) {
      setTimeout(() => void readLists(session, cursor), STALE_RETRY_MS);
      return;
    }
    report(error);
  }
}

function report(error: unknown): void {
  if (error instanceof ApiError && error.code === 'UNAUTHENTICATED') {
    signOut('The server refused the token; sign in again.');
    return;
  }
  byId('problem').textContent = error instanceof Error ? error.message : String(error);
}

function signOut(message = ''): void {
  running?.feed.stop();
  running?.timers.forEach((timer) => clearInterval(timer));
  running = undefined;
  forget();
  byId('dashboard').hidden = true;
  byId('sign-out').hidden = true;
  byId('sign-in').hidden = false;
  byId('who').textContent = '';
  byId('sign-in-error').textContent = message;
  byId<HTMLTextAreaElement>('token').focus();
}

byId<HTMLFormElement>('sign-in-form').addEventListener('submit', (submit) => {
  submit.preventDefault();
  const field = byId<HTMLTextAreaElement>('token');
  try {
    const session = sessionOf(field.value);
    field.value = '';
    byId('sign-in-error').textContent = '';
    signIn(session);
  } catch (error) {
    byId('sign-in-error').textContent = error instanceof NotAToken ? error.message : String(error);
    field.focus();
  }
});
byId('sign-out').addEventListener('click', () => signOut());

const session = stored();
if (session) signIn(session);
