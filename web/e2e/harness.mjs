// What every browser scenario shares. A scenario is started by a Rust test
// (`ops/tests/gateway/browser.rs`) against a real `leasehold serve`, with
//   LEASEHOLD_BASE    the server's http://127.0.0.1:PORT
//   LEASEHOLD_TOKENS  a JSON object of tokens by name (acme, globex, operator)
//   LEASEHOLD_SHOTS   a folder for the scenario's screenshots
// It drives Debian's Chromium through playwright-core, asks the test for what only the test
// can do (stop and start the server) by printing one JSON line and reading one line back, and
// ends by printing {"done": ...} and exiting 0. Any failed expectation exits 1, naming it.
import { basename } from 'node:path';
import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';

export const base = process.env.LEASEHOLD_BASE;
export const tokens = JSON.parse(process.env.LEASEHOLD_TOKENS ?? '{}');
export const shots = process.env.LEASEHOLD_SHOTS;

/** How long any one expectation may take to come true on a loaded machine. */
export const WAIT_MS = 60_000;

/** Flags that keep Chromium from reaching out on its own (this machine's network is closed;
 * without them it retries lookups of Google's hosts all the time). */
const QUIET = [
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--disable-default-apps',
  '--disable-extensions',
];

/** Chromium, headless, with a fresh profile. With `isolated`, every host but the loopback
 * fails to resolve, as on a network with no way out. */
export async function launch({ isolated = false } = {}) {
  const args = [...QUIET];
  if (isolated) args.push('--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1');
  return chromium.launch({
    executablePath: process.env.LEASEHOLD_CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args,
  });
}

/** Pages opened, for what a failure reports of them. */
const pages = [];
/** What the pages logged to their console, for a failure's report. */
const consoleLines = [];

/** A new page of its own context (its own session storage), failing the scenario on any
 * script error the page raises. */
export async function newPage(browser, options = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, ...options });
  const page = await context.newPage();
  page.on('pageerror', (error) => fail(`the page raised: ${error.message}`));
  page.on('console', (message) => consoleLines.push(`${message.type()}: ${message.text()}`));
  pages.push(page);
  return page;
}

/** Runs the scenario `body`; a failure reports what each page showed (its problem line,
 * its console, a screenshot `failed-SCENARIO-N.png` beside the scenario's screenshots) and exits 1. */
export async function scenario(body) {
  try {
    await body();
  } catch (error) {
    for (const [index, page] of pages.entries()) {
      try {
        console.error(`page ${index} is at ${page.url()}`);
        const name = basename(process.argv[1], '.mjs');
        if (shots) await page.screenshot({ path: `${shots}/failed-${name}-${index}.png`, fullPage: true });
        const problem = page.locator('#problem');
        if ((await problem.count()) > 0) console.error(`page ${index} says: ${await problem.textContent()}`);
      } catch {
        // The page is gone; the error below says enough.
      }
    }
    if (consoleLines.length) console.error(`console:\n${consoleLines.slice(-30).join('\n')}`);
    fail(error instanceof Error ? error.stack ?? error.message : String(error));
  }
}

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

/** Asks the test for `request` (one JSON line) and waits for its one-line answer. */
export async function ask(request) {
  console.log(JSON.stringify(request));
  const answer = await lines.next();
  if (answer.done) fail(`the test did not answer ${JSON.stringify(request)}`);
  return answer.value;
}

/** Ends the scenario: its summary for the test, then exit 0. */
export function done(summary = {}) {
  console.log(JSON.stringify({ done: summary }));
  process.exit(0);
}

export function fail(message) {
  console.error(`FAILED: ${message}`);
  process.exit(1);
}

export function expect(condition, message) {
  if (!condition) fail(message);
}

/** A query or mutation through the API, as `token`: its data (errors fail the scenario). */
export async function api(token, query, variables = {}) {
  const response = await fetch(`${base}/graphql`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: JSON.stringify({ query, variables }),
  });
  const answer = await response.json();
  if (answer.errors) fail(`the API refused ${query.split('(')[0]}: ${JSON.stringify(answer.errors)}`);
  return answer.data;
}

/** Signs in on the dashboard by typing `token` and pressing the button, as a person would. */
export async function signIn(page, token) {
  await page.goto(`${base}/`);
  await page.getByLabel('Your token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#link[data-state="live"]').waitFor({ timeout: WAIT_MS });
}

/** A one-item lease request of `tenant`'s, under `key`; the lease's id. */
export async function requestLease(token, key) {
  const data = await api(
    token,
    `mutation($input: RequestLeaseInput!) { requestLease(input: $input) { id cursor } }`,
    {
      input: {
        operationKey: key,
        providerId: '00000000-0000-0000-0000-000000000007',
        items: [{ sku: 'gpu.h100.1x', quantity: 1 }],
        payload: 'image: trainer:1',
      },
    },
  );
  return data.requestLease.id;
}

/** A screenshot of the page under `name`, where the test asked for screenshots. */
export async function screenshot(page, name) {
  if (shots) await page.screenshot({ path: `${shots}/${name}.png`, fullPage: true });
}
