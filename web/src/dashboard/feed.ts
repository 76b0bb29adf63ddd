// The lifecycle feed: the newest event first, the last `FEED_MAX` kept.
import { byId, h, timeOf } from './dom';
import type { LifecycleEvent, LinkState } from './live';

const FEED_MAX = 200;

/** The first characters of an id: enough to tell streams apart at a glance. */
function short(id: string): string {
  return id.length > 13 ? `${id.slice(0, 8)}…` : id;
}

/** Puts `event` at the top of the feed. */
export function showEvent(event: LifecycleEvent): void {
  const feed = byId<HTMLOListElement>('feed');
  byId('feed-empty').hidden = true;
  const row = h(
    'li',
    { 'data-cursor': event.cursor, 'data-stream': event.streamId },
    timeOf(event.recordedAt),
    ' ',
    h('span', { class: 'event-type' }, event.type),
    ' ',
    h('span', { class: 'stream-type' }, event.streamType),
    ' ',
    h('code', { title: event.streamId }, short(event.streamId)),
    event.tenantId ? h('span', { class: 'tenant' }, ` · ${event.tenantId}`) : null,
  );
  feed.prepend(row);
  while (feed.children.length > FEED_MAX) feed.lastElementChild?.remove();
  byId('feed-count').textContent = String(Number(byId('feed-count').textContent) + 1);
}

/** Shows how the feed's connection stands. */
export function showLink(link: LinkState): void {
  const status = byId('link');
  status.dataset.state = link.state;
  switch (link.state) {
    case 'connecting':
      status.textContent = 'Connecting…';
      break;
    case 'live':
      status.textContent = 'Live';
      break;
    case 'reconnecting':
      status.textContent = `Reconnecting… (attempt ${link.attempt}); the feed resumes where it stopped`;
      break;
    case 'failed':
      status.textContent = `Feed stopped: ${link.message}`;
      break;
  }
}
