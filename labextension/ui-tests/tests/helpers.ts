import type { Page } from '@playwright/test';

export const PLUGIN_ID = 'gpuspawner-labextension:plugin';
export const STATUS = '#gpuspawner-gpu-status';
export const PANEL = '#gpuspawner-gpu-panel';
export const METRICS_PATH = '/api/gpuspawner/metrics';

/** Set one of the extension's settings through JupyterLab's setting registry. */
export async function setSetting(page: Page, key: string, value: unknown): Promise<void> {
  await page.evaluate(
    async ({ id, key, value }) => {
      const registry = await (window as any).galata.getPlugin(
        '@jupyterlab/apputils-extension:settings'
      );
      await registry.set(id, key, value);
    },
    { id: PLUGIN_ID, key, value }
  );
}

/** The extension's current composite settings, from the setting registry. */
export async function getSettings(page: Page): Promise<Record<string, unknown>> {
  return page.evaluate(async id => {
    const registry = await (window as any).galata.getPlugin(
      '@jupyterlab/apputils-extension:settings'
    );
    return (await registry.load(id)).composite;
  }, PLUGIN_ID);
}

/** Records when the page asks the server extension for metrics (ms since the epoch). */
export function recordMetricsRequests(page: Page): number[] {
  const times: number[] = [];
  page.on('request', request => {
    if (new URL(request.url()).pathname.endsWith(METRICS_PATH)) {
      times.push(Date.now());
    }
  });
  return times;
}

export function gaps(times: number[]): number[] {
  return times.slice(1).map((t, i) => t - times[i]);
}

export function median(values: number[]): number {
  const s = [...values].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}
