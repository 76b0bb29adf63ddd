// GraphiQL on a network with no way out: every host but the loopback fails to resolve, and
// any request for another host is refused and counted. Signed in on the dashboard, GraphiQL
// opens with the token preset and runs a query.
import { WAIT_MS, base, done, expect, launch, newPage, screenshot, signIn, tokens, scenario } from './harness.mjs';

await scenario(async () => {
  const browser = await launch({ isolated: true });
  const page = await newPage(browser);
  const origin = new URL(base).origin;
  const elsewhere = [];
  const refusedByPolicy = [];
  await page.context().route('**/*', (route) => {
    const url = route.request().url();
    if (url.startsWith(origin) || url.startsWith('data:') || url.startsWith('blob:')) return route.continue();
    elsewhere.push(url);
    return route.abort('addressunreachable');
  });
  page.on('console', (message) => {
    if (message.text().includes('Content Security Policy')) refusedByPolicy.push(message.text());
  });

  await signIn(page, tokens.acme);
  await page.getByRole('link', { name: 'GraphiQL' }).click();
  await page.waitForURL(`${origin}/graphql`);
  // The editors load after the page (CodeMirror comes in chunks of its own); a run before the
  // query editor holds its query runs nothing.
  await page
    .locator('.graphiql-query-editor .CodeMirror-code', { hasText: 'workloads' })
    .waitFor({ timeout: WAIT_MS });
  await page.locator('.graphiql-execute-button').click();
  await page.waitForFunction(
    () => (document.querySelector('.graphiql-response')?.textContent ?? '').includes('"workloads"'),
    null,
    { timeout: WAIT_MS },
  );
  const answer = await page.locator('.graphiql-response').textContent();
  expect(!answer.includes('UNAUTHENTICATED'), `the preset token was sent: ${answer.slice(0, 300)}`);
  expect(elsewhere.length === 0, `requests left the machine: ${elsewhere.join(', ')}`);
  expect(refusedByPolicy.length === 0, `the page asked for what its policy refuses: ${refusedByPolicy.join('; ')}`);
  await screenshot(page, 'graphiql');
  await browser.close();
  done({ elsewhere: elsewhere.length });
});
