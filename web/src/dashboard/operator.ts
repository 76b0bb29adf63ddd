// An operator's views: how far behind each projection, reconciler and relay is, what each
// host has and what its VMs hold, and the work that was given up on (dead letters).
import { graphql } from './api';
import { byId, count, h, replace, timeOf } from './dom';

interface Projection {
  name: string;
  kind: string;
  version: number;
  eventsBehind: number;
  secondsBehind: number;
  state: string;
  error: string | null;
}

interface Host {
  id: string;
  state: string;
  backend: string;
  capacity: Record<string, unknown>;
  allocated: Record<string, unknown>;
  vmCount: number;
}

interface DeadLetter {
  kind: string;
  entityId: string;
  reason: string;
  retryCount: number;
  lastSeen: string;
}

const PROJECTIONS = `query Lag {
  projections { name kind version eventsBehind secondsBehind state error }
}`;

const FLEET = `query Fleet {
  hosts { id state backend capacity allocated vmCount }
  deadLetters { kind entityId reason retryCount lastSeen }
}`;

/** Reads the lag. No subscription carries it, so the page asks now and then. */
export async function readLag(token: string): Promise<Projection[]> {
  return (await graphql<{ projections: Projection[] }>(token, PROJECTIONS)).projections;
}

/** An operator's fleet lists, as read at one moment. */
export interface Fleet {
  hosts: Host[];
  deadLetters: DeadLetter[];
}

/** Reads the hosts and dead letters, as of `minCursor` at least. */
export async function readFleet(token: string, minCursor?: string): Promise<Fleet> {
  return graphql<Fleet>(token, FLEET, {}, minCursor);
}

/** Draws what `readFleet` read. */
export function showFleet(fleet: Fleet): void {
  showHosts(fleet.hosts);
  showDeadLetters(fleet.deadLetters);
}

/** Draws what `readLag` read. */
export function showLag(projections: Projection[]): void {
  byId('lag-empty').hidden = projections.length > 0;
  byId('lag-table').hidden = projections.length === 0;
  // The bars share one scale: the furthest behind, at least 100 events.
  const scale = Math.max(100, ...projections.map((projection) => projection.eventsBehind));
  const rows = projections.map((projection) =>
    h(
      'tr',
      { 'data-name': projection.name },
      h('th', { scope: 'row' }, projection.name),
      h('td', {}, projection.kind.toLowerCase()),
      h('td', {}, `v${projection.version}`),
      h('td', { class: `state state-${projection.state.toLowerCase()}` }, projection.state.toLowerCase(),
        projection.error ? h('span', { class: 'error' }, `: ${projection.error}`) : null),
      h(
        'td',
        { class: 'behind' },
        h('meter', {
          min: 0,
          max: scale,
          value: projection.eventsBehind,
          high: scale / 2,
          optimum: 0,
          'aria-label': `${projection.name} events behind`,
        }),
        h('span', { class: 'figure' }, `${count(projection.eventsBehind)} events, ${projection.secondsBehind.toFixed(1)} s`),
      ),
    ),
  );
  replace(byId('lag'), ...rows);
}

/** The resources a host has some of, in a stable order. */
function resourcesOf(host: Host): string[] {
  return Object.keys(host.capacity)
    .filter((key) => typeof host.capacity[key] === 'number' && Number(host.capacity[key]) > 0)
    .sort();
}

function showHosts(hosts: Host[]): void {
  byId('hosts-empty').hidden = hosts.length > 0;
  const charts = hosts.map((host) =>
    h(
      'figure',
      { class: 'host', 'data-host': host.id },
      h('figcaption', {}, h('strong', {}, host.id), ` · ${host.state} · ${host.backend} · ${count(host.vmCount)} VMs`),
      h(
        'ul',
        { class: 'bars' },
        ...resourcesOf(host).map((resource) => {
          const capacity = Number(host.capacity[resource]);
          const allocated = Number(host.allocated[resource] ?? 0);
          return h(
            'li',
            {},
            h('span', { class: 'resource' }, resource),
            h('span', { class: 'figure' }, `${count(allocated)} of ${count(capacity)}`),
            h('meter', {
              min: 0,
              max: Math.max(capacity, allocated, 1),
              value: allocated,
              high: capacity * 0.85,
              optimum: 0,
              'aria-label': `${host.id} ${resource} allocated`,
            }),
          );
        }),
      ),
    ),
  );
  replace(byId('hosts'), ...charts);
}

function showDeadLetters(letters: DeadLetter[]): void {
  byId('dead-letters-empty').hidden = letters.length > 0;
  byId('dead-letters-table').hidden = letters.length === 0;
  const rows = letters.map((letter) =>
    h(
      'tr',
      {},
      h('td', {}, letter.kind),
      h('td', {}, h('code', {}, letter.entityId)),
      h('td', {}, letter.reason),
      h('td', {}, count(letter.retryCount)),
      h('td', {}, timeOf(letter.lastSeen)),
    ),
  );
  replace(byId('dead-letters'), ...rows);
}
