// A tenant's views: its workloads of every kind and its quota usage against its limits.
import { graphql } from './api';
import { byId, count, h, replace, timeOf } from './dom';

interface Workload {
  id: string;
  kind: string;
  state: string;
  resources: { sku: string; quantity: number }[];
  backendName: string | null;
  updatedAt: string;
}

interface QuotaUsage {
  kind: string;
  activeCount: number;
  skus: { sku: string; quantity: number }[];
  limits: { resource: string; used: number; max: number }[];
}

const WORKLOADS = `query Workloads {
  workloads(first: 100) {
    edges { node { id kind state resources { sku quantity } backendName updatedAt } }
  }
}`;

const QUOTAS = `query Quotas {
  quotaUsage { kind activeCount skus { sku quantity } limits { resource used max } }
}`;

/** A tenant's lists, as read at one moment. */
export interface TenantLists {
  workloads: Workload[];
  quotas: QuotaUsage[];
}

/** Reads the workloads and quotas, as of `minCursor` at least. */
export async function readTenant(token: string, minCursor?: string): Promise<TenantLists> {
  const [workloads, quotas] = await Promise.all([
    graphql<{ workloads: { edges: { node: Workload }[] } }>(token, WORKLOADS, {}, minCursor),
    graphql<{ quotaUsage: QuotaUsage[] }>(token, QUOTAS, {}, minCursor),
  ]);
  return { workloads: workloads.workloads.edges.map((edge) => edge.node), quotas: quotas.quotaUsage };
}

/** Draws what `readTenant` read. */
export function showTenant(lists: TenantLists): void {
  showWorkloads(lists.workloads);
  showQuotas(lists.quotas);
}

function showWorkloads(workloads: Workload[]): void {
  byId('workloads-empty').hidden = workloads.length > 0;
  byId('workloads-table').hidden = workloads.length === 0;
  const rows = workloads.map((workload) =>
    h(
      'tr',
      { 'data-id': workload.id, 'data-kind': workload.kind },
      h('td', {}, workload.kind),
      h('td', {}, h('code', { title: workload.id }, workload.id.slice(0, 8))),
      h('td', {}, h('span', { class: `state state-${workload.state}` }, workload.state)),
      h(
        'td',
        {},
        workload.resources
          .filter((resource) => resource.quantity > 0)
          .map((resource) => `${count(resource.quantity)} × ${resource.sku}`)
          .join(', ') ||
          '—',
      ),
      h('td', {}, workload.backendName ?? '—'),
      h('td', {}, timeOf(workload.updatedAt)),
    ),
  );
  replace(byId('workloads'), ...rows);
}

function showQuotas(quotas: QuotaUsage[]): void {
  byId('quotas-empty').hidden = quotas.length > 0;
  const cards = quotas.map((quota) =>
    h(
      'div',
      { class: 'quota', 'data-kind': quota.kind },
      h('h3', {}, `${quota.kind}: ${count(quota.activeCount)} active`),
      quota.limits.length > 0
        ? h('ul', { class: 'bars' }, ...quota.limits.map((limit) => limitBar(quota.kind, limit)))
        : h(
            'p',
            { class: 'muted' },
            quota.skus.map((sku) => `${count(sku.quantity)} × ${sku.sku}`).join(', ') || 'nothing held',
            ' · no limit set',
          ),
    ),
  );
  replace(byId('quotas'), ...cards);
}

/** One limit as a bar: what is used against the most allowed. A resource with no limit has
 * nothing to fill, so it is a figure alone. */
function limitBar(kind: string, limit: { resource: string; used: number; max: number }): HTMLLIElement {
  if (limit.max === 0) {
    return h(
      'li',
      {},
      h('span', { class: 'resource' }, limit.resource),
      h('span', { class: 'figure' }, `${count(limit.used)} used · no limit`),
    );
  }
  const id = `limit-${kind}-${limit.resource}`.replace(/[^a-z0-9-]/gi, '-');
  return h(
    'li',
    {},
    h('label', { for: id }, limit.resource),
    h('span', { class: 'figure' }, `${count(limit.used)} of ${count(limit.max)}`),
    h('meter', { id, min: 0, max: limit.max, value: limit.used, high: limit.max * 0.8, optimum: 0 }),
  );
}
