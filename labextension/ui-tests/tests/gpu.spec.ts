/**
 * JupyterLab with the gpuviews server extension answering from the NVML test double (two fake
 * A100s, 37 % and 80 % busy, 10 and 20 GiB of 80 GiB used): the status bar item shows their
 * values, and the settings (schema/plugin.json) change the poll interval, the GPUs shown and
 * the units live, through the setting registry and through the Settings Editor.
 */
import { expect, test } from '@jupyterlab/galata';

import {
  gaps,
  getSettings,
  median,
  PANEL,
  recordMetricsRequests,
  setSetting,
  STATUS
} from './helpers';

test('the status bar item shows the GPUs of the server extension', async ({ page }) => {
  const item = page.locator(STATUS);
  await expect(item).toHaveText('2 GPUs 59% · 30.0/160.0 GiB');
  await expect(item).toHaveAttribute('data-level', 'ok');
  // clicking it opens the side panel with one card per GPU
  await item.click();
  await expect(page.locator(PANEL)).toBeVisible();
  await expect(page.locator(`${PANEL} .jp-gpuspawner-gpu`)).toHaveCount(2);
  await expect(page.locator(PANEL)).toContainText('PCI 00000000:87:00.0');
});

test('the settings choose the GPUs and the units, live', async ({ page }) => {
  const item = page.locator(STATUS);
  await expect(item).toHaveText(/^2 GPUs /);
  await setSetting(page, 'gpus', ['1']);
  await expect(item).toHaveText('GPU 80% · 20.0/80.0 GiB');
  await setSetting(page, 'units', 'MiB');
  await expect(item).toHaveText('GPU 80% · 20480/81920 MiB');
  await setSetting(page, 'units', 'percent');
  await expect(item).toHaveText('GPU 80% · mem 25%');
  await setSetting(page, 'gpus', ['GPU-none']);
  await expect(item).toHaveText('GPU: none selected');
});

test('pollInterval changes how often the open panel polls', async ({ page }) => {
  const times = recordMetricsRequests(page);
  await page.locator(STATUS).click();
  await expect(page.locator(PANEL)).toBeVisible();
  await expect(page.locator(`${PANEL} .jp-gpuspawner-gpu`)).toHaveCount(2);

  /** the metrics requests from `since` on, once there are `n` of them (bounded wait) */
  async function requestsSince(since: number, n: number, timeout: number): Promise<number[]> {
    await expect
      .poll(() => times.filter(t => t >= since).length, { timeout })
      .toBeGreaterThanOrEqual(n);
    return times.filter(t => t >= since);
  }

  // the default: every 2 s while the panel is open
  const defaults = gaps(await requestsSince(Date.now(), 4, 15000));
  expect(median(defaults), `gaps ${defaults}`).toBeGreaterThan(1500);
  expect(median(defaults), `gaps ${defaults}`).toBeLessThan(2600);

  // 500 ms: the pending 2 s tick is replaced at once
  let changed = Date.now();
  await setSetting(page, 'pollInterval', 500);
  const fast = await requestsSince(changed, 8, 10000);
  expect(fast[0] - changed, `first request ${fast[0] - changed} ms after the change`).toBeLessThan(
    1500
  );
  expect(median(gaps(fast)), `gaps ${gaps(fast)}`).toBeGreaterThan(350);
  expect(median(gaps(fast)), `gaps ${gaps(fast)}`).toBeLessThan(800);

  // 4 s: the fast polling stops
  changed = Date.now();
  await setSetting(page, 'pollInterval', 4000);
  const slow = await requestsSince(changed, 3, 20000);
  expect(Math.min(...gaps(slow)), `gaps ${gaps(slow)}`).toBeGreaterThan(3500);
  expect(Math.max(...gaps(slow)), `gaps ${gaps(slow)}`).toBeLessThan(5500);
  expect((await getSettings(page)).pollInterval).toBe(4000);
});

test('pollInterval is editable in the Settings Editor', async ({ page }) => {
  const times = recordMetricsRequests(page);
  await page.locator(STATUS).click();
  await expect(page.locator(PANEL)).toBeVisible();

  await page.evaluate(async () => {
    await (window as any).jupyterapp.commands.execute('settingeditor:open', {
      query: 'GPU views'
    });
  });
  // the form the Settings Editor builds from schema/plugin.json
  const form = page.getByRole('group', { name: 'GPU views (gpuspawner)' });
  await expect(
    form.getByRole('heading', { name: 'Poll interval of the panel (ms)' })
  ).toBeVisible();
  const field = form.locator('input[id$="_pollInterval"]');
  await expect(field).toBeVisible();
  await expect(field).toHaveValue('2000');
  await field.fill('1000');
  await field.press('Tab');
  await expect
    .poll(async () => (await getSettings(page)).pollInterval, { timeout: 10000 })
    .toBe(1000);

  const changed = Date.now();
  await expect
    .poll(() => times.filter(t => t >= changed).length, { timeout: 15000 })
    .toBeGreaterThanOrEqual(5);
  const after = gaps(times.filter(t => t >= changed));
  expect(median(after), `gaps ${after}`).toBeGreaterThan(750);
  expect(median(after), `gaps ${after}`).toBeLessThan(1400);
});

test('a server the hub moved off a failed node tells the user once', async ({ page }) => {
  // the server extension's answer as a moved server gives it (the spawner's
  // $GPUSPAWNER_MOVED, read back as `moved`); the next poll carries it
  await page.route('**/api/gpuspawner/gpus*', async route => {
    const response = await route.fetch();
    const json = await response.json();
    json.moved = { from: 'gpu-a', to: 'gpu-b', at: 1764000000, reason: 'node gpu-a is down' };
    await route.fulfill({ response, json });
  });
  const told = page.getByText(
    'Your server moved from node gpu-a to node gpu-b at 2025-11-24 16:00 UTC. Files in your ' +
      'home are safe; running kernels were lost.'
  );
  await page.locator(STATUS).click(); // the open panel polls every 2 s
  await expect(told).toBeVisible({ timeout: 20000 });
  await expect(told).toHaveCount(1);
  // reloading JupyterLab does not tell it again (remembered in the browser's storage)
  await page.reload();
  await expect(page.locator(STATUS)).toHaveText(/^2 GPUs /);
  await page.locator(STATUS).click();
  await expect(page.locator(`${PANEL} .jp-gpuspawner-gpu`)).toHaveCount(2);
  await page.waitForResponse(r => r.url().includes('/api/gpuspawner/gpus'), { timeout: 15000 });
  await expect(told).toHaveCount(0);
});
