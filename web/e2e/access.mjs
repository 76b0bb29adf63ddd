// Usable by keyboard alone and on a narrow screen, with no serious or critical finding of
// axe-core (labels, contrast, names, structure) on the signed-in page.
import { createRequire } from 'node:module';
import { WAIT_MS, base, done, expect, fail, launch, newPage, requestLease, screenshot, tokens, scenario } from './harness.mjs';

await scenario(async () => {
  const require = createRequire(import.meta.url);
  const browser = await launch();
  // axe-core is injected into the page, which the page's own policy would refuse.
  const page = await newPage(browser, { viewport: { width: 360, height: 780 }, bypassCSP: true });
  await requestLease(tokens.acme, 'listed-for-axe');
  await page.goto(`${base}/`);

  // Keyboard only: Tab to the token field, type, Tab to the button, press Enter.
  let focused = '';
  for (let tabs = 0; tabs < 10 && focused !== 'token'; tabs += 1) {
    await page.keyboard.press('Tab');
    focused = await page.evaluate(() => document.activeElement?.id ?? '');
  }
  expect(focused === 'token', 'Tab reaches the token field');
  await page.keyboard.type(tokens.acme);
  await page.keyboard.press('Tab');
  expect(
    await page.evaluate(() => document.activeElement?.textContent?.trim() === 'Sign in'),
    'Tab goes on to the sign-in button',
  );
  await page.keyboard.press('Enter');
  await page.locator('#link[data-state="live"]').waitFor({ timeout: WAIT_MS });
  await page.locator('#workloads tr').first().waitFor({ timeout: WAIT_MS });
  await page.locator('.quota').first().waitFor({ timeout: WAIT_MS });

  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  expect(overflow <= 0, `the page is ${overflow}px wider than a 360px screen`);

  await page.addScriptTag({ path: require.resolve('axe-core/axe.min.js') });
  const results = await page.evaluate(() => globalThis.axe.run(document, { resultTypes: ['violations'] }));
  const serious = results.violations.filter((violation) => ['serious', 'critical'].includes(violation.impact));
  if (serious.length > 0) {
    fail(serious.map((violation) => `${violation.id}: ${violation.nodes.map((node) => node.target).join(' ')}`).join('; '));
  }
  await screenshot(page, 'dashboard-narrow');
  await browser.close();
  done({ minor: results.violations.length });
});
