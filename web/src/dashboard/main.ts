// The dashboard: sign in by pasting a token, then the live lifecycle feed and, by role, a
// tenant's workloads and quotas or an operator's lag, hosts and dead letters. Lists are read
// again when the feed shows something happened (as of that event's cursor) and whenever the
// feed connects again; only the lag, which no subscription carries, is read on a timer.
import './style.css';
import { ApiError } from './api';
import { byId, debounce, replace } from './dom';
import { showEvent, showLink } from './feed';
import { follow, type Feed } from './live';
import { readFleet, readLag, showFleet, showLag } from './operator';
import { NotAToken, forget, keep, sessionOf, stored, type Session } from './session';
import { readTenant, showTenant } from './tenant';

/** How often an operator's lag is read. */
const LAG_EVERY_MS = 5_000;

/** How long after an event the lists are read again (events come in bursts). */
const REFRESH_AFTER_MS = 250;

/** How long to wait before asking again when the read models were not there yet. */
const STALE_RETRY_MS = 1_000;

/** One signed-in session's work. Once stopped, nothing it started draws on the page again:
 * an answer still in flight is dropped, and no timer of its own is left. */
class SignedIn {
  private stopped = false;
  private lastCursor: string | undefined;
  private reading = false;
  private readAgain = false;
  private retry: number | undefined;
  private lagTimer: number | undefined;
  private readonly refresh = debounce(() => this.read(), REFRESH_AFTER_MS);
  private readonly feed: Feed;

  constructor(private readonly session: Session) {
    this.feed = follow(session.token, {
      event: (event) => {
        if (this.stopped) return;
        this.lastCursor = event.cursor;
        showEvent(event);
        this.refresh.call();
      },
      link: (link) => {
        if (!this.stopped) showLink(link);
      },
      connected: () => this.read(),
      delivered: (count) => {
        if (!this.stopped) byId('feed').dataset.delivered = String(count);
      },
    });
    // Now, and again at each connection (what changed while it was away).
    this.read();
    if (session.role === 'operator') {
      this.readLag();
      this.lagTimer = window.setInterval(() => this.readLag(), LAG_EVERY_MS);
    }
  }

  stop(): void {
    this.stopped = true;
    this.feed.stop();
    this.refresh.cancel();
    window.clearTimeout(this.retry);
    window.clearInterval(this.lagTimer);
  }

  /** Reads the role's lists as of the last event shown, one read at a time (an older answer
   * never draws over a newer one); a call while one runs reads once more after it. */
  read(): void {
    if (this.stopped) return;
    if (this.reading) {
      this.readAgain = true;
      return;
    }
    this.reading = true;
    window.clearTimeout(this.retry);
    void this.readOnce().finally(() => {
      this.reading = false;
      if (this.readAgain) {
        this.readAgain = false;
        this.read();
      }
    });
  }

  private async readOnce(): Promise<void> {
    const { token, role } = this.session;
    try {
      if (role === 'tenant') {
        const lists = await readTenant(token, this.lastCursor);
        if (!this.stopped) showTenant(lists);
      }
      if (role === 'operator') {
        const fleet = await readFleet(token, this.lastCursor);
        if (!this.stopped) showFleet(fleet);
      }
      if (!this.stopped) byId('problem').textContent = '';
    } catch (error) {
      if (error instanceof ApiError && (error.code === 'STALE' || error.code === 'UNAVAILABLE')) {
        // The read models have not reached the event yet, or the server is away: once more.
        this.retry = window.setTimeout(() => this.read(), STALE_RETRY_MS);
        return;
      }
      this.report(error);
    }
  }

  private readLag(): void {
    readLag(this.session.token)
      .then((projections) => {
        if (!this.stopped) showLag(projections);
      })
      .catch((error) => this.report(error));
  }

  private report(error: unknown): void {
    if (this.stopped) return;
    if (error instanceof ApiError && error.code === 'UNAUTHENTICATED') {
      signOut('The server refused the token; sign in again.');
      return;
    }
    byId('problem').textContent = error instanceof Error ? error.message : String(error);
  }
}

let current: SignedIn | undefined;

function signIn(session: Session): void {
  keep(session);
  byId('sign-in').hidden = true;
  byId('dashboard').hidden = false;
  byId('sign-out').hidden = false;
  byId('who').textContent =
    session.role === 'tenant'
      ? `tenant ${session.tenant ?? '?'} (${session.subject})`
      : `${session.role} ${session.subject}`;
  byId('tenant-views').hidden = session.role !== 'tenant';
  byId('operator-views').hidden = session.role !== 'operator';
  current = new SignedIn(session);
}

/** Empties every view, so that the next session never sees this one's rows. */
function clearViews(): void {
  for (const id of ['feed', 'workloads', 'quotas', 'lag', 'hosts', 'dead-letters', 'problem']) {
    replace(byId(id));
  }
  byId('feed-count').textContent = '0';
  delete byId('feed').dataset.delivered;
  for (const id of ['feed-empty', 'workloads-empty', 'quotas-empty', 'lag-empty', 'hosts-empty', 'dead-letters-empty']) {
    byId(id).hidden = false;
  }
  for (const id of ['workloads-table', 'lag-table', 'dead-letters-table']) byId(id).hidden = true;
}

function signOut(message = ''): void {
  current?.stop();
  current = undefined;
  forget();
  clearViews();
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
