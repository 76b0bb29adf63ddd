// A tenant signs in; an event created through the API reaches the feed, the workload list
// changes live, and another tenant's lease shows nowhere on the page.
import { WAIT_MS, api, done, expect, launch, newPage, requestLease, screenshot, signIn, tokens, scenario } from './harness.mjs';

await scenario(async () => {
  const browser = await launch();
  const page = await newPage(browser);
  await signIn(page, tokens.acme);
  expect(await page.locator('#tenant-views').isVisible(), 'a tenant sees its workloads and quotas');
  expect(!(await page.locator('#operator-views').isVisible()), 'a tenant sees no operator views');

  // Another tenant's lease, before and after acme's own: neither may show.
  const before = await requestLease(tokens.globex, 'globex-before');
  const own = await requestLease(tokens.acme, 'acme-first');
  await page.locator(`#feed li[data-stream*="${own}"]`).first().waitFor({ timeout: WAIT_MS });
  const row = page.locator(`#workloads tr[data-id="${own}"]`);
  await row.waitFor({ timeout: WAIT_MS });
  const requested = (await row.locator('td').nth(2).textContent()).trim();

  // The list changes live: the lease released through the API changes state on the page.
  await api(
    tokens.acme,
    `mutation($input: LeaseOperationInput!) { deprovisionLease(input: $input) { id } }`,
    { input: { leaseId: own, operationKey: 'acme-release' } },
  );
  await page.waitForFunction(
    ([id, from]) => {
      const cell = document.querySelector(`#workloads tr[data-id="${id}"] td:nth-child(3)`);
      return cell && cell.textContent.trim() !== from;
    },
    [own, requested],
    { timeout: WAIT_MS },
  );
  const released = (await row.locator('td').nth(2).textContent()).trim();
  expect(released.startsWith('deprovision'), `the release shows: ${requested} → ${released}`);

  const after = await requestLease(tokens.globex, 'globex-after');
  const second = await requestLease(tokens.acme, 'acme-second');
  await page.locator(`#workloads tr[data-id="${second}"]`).waitFor({ timeout: WAIT_MS });
  await page.locator(`#feed li[data-stream*="${second}"]`).first().waitFor({ timeout: WAIT_MS });
  await page.locator('.quota[data-kind="lease"]').waitFor({ timeout: WAIT_MS });
  const html = await page.content();
  for (const foreign of [before, after, 'globex']) {
    expect(!html.includes(foreign), `acme's page shows ${foreign}, another tenant's`);
  }
  const feedRows = await page.locator('#feed li').count();
  await screenshot(page, 'dashboard-tenant');
  await browser.close();
  done({ requested, released, feedRows });
});
