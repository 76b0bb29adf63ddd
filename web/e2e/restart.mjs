// The page outlives a server restart: it says it is reconnecting, then resumes the feed from
// the last event it showed, so events written while the server was down arrive, and none
// arrives twice.
import { WAIT_MS, ask, done, expect, launch, newPage, requestLease, signIn, tokens, scenario } from './harness.mjs';

await scenario(async () => {
  const browser = await launch();
  const page = await newPage(browser);
  await signIn(page, tokens.acme);
  const first = await requestLease(tokens.acme, 'before-restart');
  await page.locator(`#feed li[data-stream*="${first}"]`).first().waitFor({ timeout: WAIT_MS });

  await ask({ stop: true });
  await page.locator('#link[data-state="reconnecting"]').waitFor({ timeout: WAIT_MS });
  const shown = await page.locator('#link').textContent();
  expect(shown.includes('Reconnecting'), `the page says it is reconnecting: ${shown}`);
  // Written while the server is down, straight to its database.
  const whileDown = (await ask({ write: true })).trim();
  await ask({ start: true });

  await page.locator('#link[data-state="live"]').waitFor({ timeout: WAIT_MS });
  await page.locator(`#feed li[data-stream*="${whileDown}"]`).first().waitFor({ timeout: WAIT_MS });
  const after = await requestLease(tokens.acme, 'after-restart');
  await page.locator(`#feed li[data-stream*="${after}"]`).first().waitFor({ timeout: WAIT_MS });
  await page.locator(`#workloads tr[data-id="${after}"]`).waitFor({ timeout: WAIT_MS });

  const cursors = await page.locator('#feed li').evaluateAll((rows) => rows.map((row) => row.dataset.cursor));
  expect(new Set(cursors).size === cursors.length, `a feed row repeated: ${cursors.length} rows`);
  // The server itself sent nothing twice (the page would drop a repeat before showing it).
  const delivered = Number(await page.locator('#feed').getAttribute('data-delivered'));
  expect(delivered === cursors.length, `${delivered} events delivered for ${cursors.length} rows`);
  for (const lease of [first, whileDown, after]) {
    const rows = await page.locator(`#feed li[data-stream="lease-${lease}"]`).count();
    expect(rows === 1, `lease ${lease}'s event shows ${rows} times`);
    expect(await page.locator(`#workloads tr[data-id="${lease}"]`).count() === 1, `lease ${lease} listed once`);
  }
  await browser.close();
  done({ rows: cursors.length });
});
