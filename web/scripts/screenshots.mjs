// The README's screenshots, taken of a running `leasehold serve --demo`:
//   node web/scripts/screenshots.mjs http://127.0.0.1:8080 TENANT_TOKEN OPERATOR_TOKEN [FOLDER]
// (FOLDER defaults to docs/screenshots). It signs in as each, waits until the demo has filled
// the views, and writes dashboard-tenant.png, dashboard-operator.png, dashboard-narrow.png and
// graphiql.png.
import { resolve } from 'node:path';
import { chromium } from 'playwright-core';

const [base, tenant, operator, folder = resolve(import.meta.dirname, '../../docs/screenshots')] =
  process.argv.slice(2);
if (!base || !tenant || !operator) {
  console.error('usage: node web/scripts/screenshots.mjs BASE_URL TENANT_TOKEN OPERATOR_TOKEN [FOLDER]');
  process.exit(2);
}
const WAIT_MS = 60_000;
const browser = await chromium.launch({
  executablePath: process.env.LEASEHOLD_CHROMIUM ?? '/usr/bin/chromium',
  args: ['--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});

async function signedIn(token, viewport = { width: 1280, height: 900 }) {
  const page = await browser.newPage({ viewport, colorScheme: 'light' });
  await page.goto(`${base}/`);
  await page.getByLabel('Your token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#link[data-state="live"]').waitFor({ timeout: WAIT_MS });
  return page;
}

const tenantPage = await signedIn(tenant);
await tenantPage.locator('#feed li:nth-child(6)').waitFor({ timeout: WAIT_MS });
await tenantPage.locator('#workloads tr[data-kind="runner"]').first().waitFor({ timeout: WAIT_MS });
await tenantPage.screenshot({ path: `${folder}/dashboard-tenant.png`, fullPage: true });

await tenantPage.getByRole('link', { name: 'GraphiQL' }).click();
await tenantPage.locator('.graphiql-query-editor .CodeMirror-code', { hasText: 'workloads' }).waitFor({ timeout: WAIT_MS });
await tenantPage.locator('.graphiql-execute-button').click();
await tenantPage.waitForFunction(
  () => (document.querySelector('.graphiql-response')?.textContent ?? '').includes('"kind"'),
  null,
  { timeout: WAIT_MS },
);
await tenantPage.screenshot({ path: `${folder}/graphiql.png` });

const narrow = await signedIn(tenant, { width: 390, height: 844 });
await narrow.locator('#workloads tr').first().waitFor({ timeout: WAIT_MS });
await narrow.screenshot({ path: `${folder}/dashboard-narrow.png` });

const operatorPage = await signedIn(operator);
await operatorPage.locator('#hosts figure').nth(1).waitFor({ timeout: WAIT_MS });
await operatorPage.locator('#lag tr').first().waitFor({ timeout: WAIT_MS });
await operatorPage.locator('#feed li:nth-child(6)').waitFor({ timeout: WAIT_MS });
await operatorPage.screenshot({ path: `${folder}/dashboard-operator.png`, fullPage: true });
await browser.close();
console.log(`screenshots written to ${folder}`);
