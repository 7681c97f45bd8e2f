/**
 * A CPU-only session: gpuspawner placed it without a GPU (its allocation lists none) and the
 * container has no NVML. The status bar item says "no GPU" in neutral colours, not an error.
 */
import { expect, test } from '@jupyterlab/galata';

import { PANEL, STATUS } from './helpers';

test('a CPU-only session shows a neutral "no GPU" item', async ({ page }) => {
  const item = page.locator(STATUS);
  await expect(item).toHaveText('GPU: no GPU');
  await expect(item).toHaveAttribute('data-level', 'idle');
  await item.click();
  const state = page.locator(`${PANEL} [data-state="no_gpu"]`);
  await expect(state).toContainText('This session was started without a GPU.');
  await expect(page.locator(`${PANEL} .jp-gpuspawner-state-error`)).toHaveCount(0);
});
