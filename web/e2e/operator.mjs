// An operator signs in: every projection's lag, a host registered through the API charted
// with its capacity and allocation (live, from the feed), the dead letters, and the whole
// log's feed, every tenant's events among it.
import { WAIT_MS, api, done, expect, launch, newPage, requestLease, screenshot, signIn, tokens, scenario } from './harness.mjs';

await scenario(async () => {
  const browser = await launch();
  const page = await newPage(browser);
  await signIn(page, tokens.operator);
  expect(await page.locator('#operator-views').isVisible(), 'an operator sees the operator views');

  for (const [host, cpus] of [['host-a', 32], ['host-b', 16]]) {
    await api(
      tokens.operator,
      `mutation($input: RegisterHostInput!) { registerHost(input: $input) { id } }`,
      {
        input: {
          operationKey: `reg-${host}`, hostId: host, url: 'http://127.0.0.1:9', cpus,
          ramMb: 65536, storageGb: 1000, vmCount: 8, labels: [{ key: 'zone', value: 'a' }],
        },
      },
    );
  }
  await page.locator('#hosts figure[data-host="host-b"]').waitFor({ timeout: WAIT_MS });
  const meters = await page.locator('#hosts figure[data-host="host-a"] meter').count();
  expect(meters > 0, 'a host is charted by resource');
  expect(await page.locator('#dead-letters-empty').isVisible(), 'no dead letters says so');

  const lease = await requestLease(tokens.acme, 'seen-by-the-operator');
  const row = page.locator(`#feed li[data-stream="lease-${lease}"]`);
  await row.waitFor({ timeout: WAIT_MS });
  expect((await row.textContent()).includes('acme'), 'the operator sees whose event it is');
  // The lag is read every few seconds (no subscription carries it): each projection shows once
  // it has applied the events above.
  await page.waitForFunction(
    () => [...document.querySelectorAll('#lag tr')].some((row) => row.dataset.name === 'lease_views'),
    null,
    { timeout: WAIT_MS },
  );
  const projections = await page.locator('#lag tr').evaluateAll((rows) => rows.map((row) => row.dataset.name));
  expect(await page.locator('#lag-empty').isHidden(), 'the empty note is gone');
  await screenshot(page, 'dashboard-operator');

  // Signed out and in again as a tenant in the same tab: nothing of the operator's session
  // is left on the page, and nothing it still had in flight draws there later.
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.getByLabel('Your token').fill(tokens.globex);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#link[data-state="live"]').waitFor({ timeout: WAIT_MS });
  const own = await requestLease(tokens.globex, 'globex-after-the-operator');
  await page.locator(`#workloads tr[data-id="${own}"]`).waitFor({ timeout: WAIT_MS });
  await page.locator(`#feed li[data-stream="lease-${own}"]`).waitFor({ timeout: WAIT_MS });
  const html = await page.content();
  for (const left of [lease, 'host-a', 'host-b', 'lease_views']) {
    expect(!html.includes(left), `the tenant's page still shows ${left} from the operator's session`);
  }
  await browser.close();
  done({ projections: projections.length, meters });
});
