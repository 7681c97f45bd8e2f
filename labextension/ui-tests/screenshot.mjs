// UI check of the GPU views in a running JupyterLab, in Debian's Chromium (playwright-core,
// no browser download). Opens JupyterLab, finds the status bar item, opens the side panel by
// clicking it, waits until the panel shows data or a state, and saves a screenshot.
//
//   node ui-tests/screenshot.mjs URL OUT.png [--sample]
//
// URL: JupyterLab's /lab URL with ?token=…; --sample answers the two REST calls in the browser
// with sample data (page.route) so the charts, the process table and the cull warning show on
// a machine without a GPU. Prints one JSON line: {status, statusLevel, panelState, panelText}.
// Env: CHROMIUM (default /usr/bin/chromium), UI_TIMEOUT_MS (default 60000), HUB_LOGIN_USER and
// HUB_LOGIN_PASSWORD (log in through JupyterHub's login form before opening URL), UI_SETTLE_MS
// (default 0: when the panel first shows "unavailable", wait up to this long for a later poll
// to show data or another state; the first error is reported as firstError either way).
import { chromium } from 'playwright-core';

const [url, out, ...flags] = process.argv.slice(2);
if (!url || !out) {
  console.error('usage: node ui-tests/screenshot.mjs URL OUT.png [--sample]');
  process.exit(2);
}
const sample = flags.includes('--sample');
const timeout = Number(process.env.UI_TIMEOUT_MS || 60000);

const GiB = 1024 ** 3;

function sampleGpus() {
  const cullAt = new Date(Date.now() + 14 * 60000 + 30000).toISOString();
  return {
    state: 'ok',
    message: '',
    allocation: { gpu_uuids: ['GPU-8f1c', 'GPU-27aa'], numa_node: 0 },
    gpus: [
      {
        uuid: 'GPU-8f1c',
        index: 0,
        name: 'NVIDIA A100-SXM4-40GB',
        memory_total_bytes: 40 * GiB,
        pci_bus_id: '00000000:07:00.0',
        numa_node: 0,
        mig: false,
        in_allocation: true
      },
      {
        uuid: 'GPU-27aa',
        index: 1,
        name: 'NVIDIA A100-SXM4-40GB',
        memory_total_bytes: 40 * GiB,
        pci_bus_id: '00000000:0F:00.0',
        numa_node: 0,
        mig: false,
        in_allocation: true
      }
    ],
    warnings: ['The allocation names 2 GPUs; CUDA_VISIBLE_DEVICES shows 1 (sample warning).'],
    // the server extension's shape: this server's idle culler decision
    culler: {
      server: {
        user: 'ada',
        server: '',
        action: 'warn',
        reason: 'idle',
        message: `will be culled at ${cullAt}, because idle for 46 min (limit 60 min)`,
        cull_at: cullAt,
        figures: {},
        policy: {}
      },
      last_pass: new Date().toISOString()
    }
  };
}

let tick = 0;
function sampleMetrics() {
  tick += 1;
  const now = Date.now();
  const history = [];
  for (let i = 60; i >= 1; i--) {
    const t = tick * 2 + 60 - i;
    history.push({
      timestamp: new Date(now - i * 2000).toISOString(),
      gpus: {
        'GPU-8f1c': {
          utilization_percent: 55 + 35 * Math.sin(t / 6),
          memory_used_bytes: (12 + 4 * Math.sin(t / 15)) * GiB
        },
        'GPU-27aa': {
          utilization_percent: i > 30 ? 0 : 80 + 10 * Math.cos(t / 4),
          memory_used_bytes: (i > 30 ? 0.5 : 22) * GiB
        }
      }
    });
  }
  return {
    state: 'ok',
    message: '',
    timestamp: new Date(now).toISOString(),
    gpus: [
      {
        uuid: 'GPU-8f1c',
        utilization_percent: 71,
        memory_used_bytes: 14.2 * GiB,
        memory_total_bytes: 40 * GiB,
        temperature_c: 58,
        power_w: 231.4,
        processes: [{ pid: 4121, used_memory_bytes: 13.7 * GiB, kernel_id: 'sample-kernel-1' }]
      },
      {
        uuid: 'GPU-27aa',
        utilization_percent: 86,
        memory_used_bytes: 22.0 * GiB,
        memory_total_bytes: 40 * GiB,
        temperature_c: 64,
        power_w: 298.0,
        processes: [
          { pid: 4388, used_memory_bytes: 21.5 * GiB, kernel_id: 'sample-kernel-2' },
          { pid: 4402, used_memory_bytes: 0.4 * GiB, kernel_id: null }
        ]
      }
    ],
    history
  };
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--no-first-run'
  ]
});
let code = 0;
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 800 } });
  const consoleErrors = [];
  const metricsRequests = [];
  let openedAt = null;
  page.on('pageerror', e => consoleErrors.push(String(e)));
  if (sample) {
    const json = body => ({
      status: 200,
      contentType: 'application/json',
      body: JSON.stringify(body)
    });
    await page.route('**/api/gpuspawner/gpus*', r => r.fulfill(json(sampleGpus())));
    await page.route('**/api/gpuspawner/metrics*', r => {
      metricsRequests.push(Date.now());
      return r.fulfill(json(sampleMetrics()));
    });
  }
  if (process.env.HUB_LOGIN_USER) {
    // behind JupyterHub: log in through the hub's login form first (a token in the URL of a
    // page is refused by JupyterHub >= 5; the browser needs the hub's OAuth cookies)
    await page.goto(new URL('/hub/login', url).href, { timeout });
    await page.fill('#username_input', process.env.HUB_LOGIN_USER);
    await page.fill('#password_input', process.env.HUB_LOGIN_PASSWORD || '');
    await Promise.all([page.waitForNavigation({ timeout }), page.click('#login_submit')]);
  }
  await page.goto(url, { timeout });
  const item = page.locator('#gpuspawner-gpu-status');
  await item.waitFor({ state: 'visible', timeout });
  // the first poll answers: the item leaves its loading text
  await page.waitForFunction(
    () => !document.querySelector('#gpuspawner-gpu-status')?.textContent?.includes('…'),
    null,
    { timeout }
  );
  if (sample) {
    // the polling cadence with only the status item shown (5 s)
    await page.waitForTimeout(11000);
  }
  openedAt = Date.now();
  await item.click();
  const panel = page.locator('#gpuspawner-gpu-panel');
  await panel.waitFor({ state: 'visible', timeout });
  await page.waitForFunction(
    () => {
      const p = document.querySelector('#gpuspawner-gpu-panel');
      return (
        !!p &&
        !!p.querySelector('.jp-gpuspawner-gpu, .jp-gpuspawner-state:not([data-state="loading"])')
      );
    },
    null,
    { timeout }
  );
  const unreachable = '#gpuspawner-gpu-panel .jp-gpuspawner-state[data-state="unreachable"]';
  const firstError = await page.evaluate(
    sel => document.querySelector(sel)?.textContent ?? null,
    unreachable
  );
  const settle = Number(process.env.UI_SETTLE_MS || 0);
  if (firstError !== null && settle > 0) {
    // a poll that failed once (the hub or the proxy slow under load) is retried by the
    // extension every 2 s while the panel is open: wait for one that answers
    await page
      .waitForFunction(sel => !document.querySelector(sel), unreachable, { timeout: settle })
      .catch(() => undefined);
  }
  if (sample) {
    // two more polls (2 s each while the panel is visible) so the charts have moved
    await page.waitForFunction(
      () => document.querySelectorAll('#gpuspawner-gpu-panel path').length >= 4,
      null,
      { timeout }
    );
    await page.waitForTimeout(6500);
  }
  // toasts (news, build notices) would cover part of the screenshot
  await page.evaluate(() => document.querySelectorAll('.Toastify__toast').forEach(t => t.remove()));
  await page.screenshot({ path: out });
  const result = await page.evaluate(() => {
    const item = document.querySelector('#gpuspawner-gpu-status');
    const p = document.querySelector('#gpuspawner-gpu-panel');
    const states = [...p.querySelectorAll('.jp-gpuspawner-state')].map(s =>
      s.getAttribute('data-state')
    );
    return {
      status: item?.textContent ?? null,
      statusLevel: item?.getAttribute('data-level') ?? null,
      panelState: states[0] ?? (p.querySelector('.jp-gpuspawner-gpu') ? 'ok' : null),
      gpuCards: p.querySelectorAll('.jp-gpuspawner-gpu').length,
      chartPaths: p.querySelectorAll('path.jp-gpuspawner-spark-line').length,
      processRows: p.querySelectorAll('.jp-gpuspawner-procs tbody tr').length,
      cull: p.querySelector('.jp-gpuspawner-cull')?.textContent ?? null,
      warnings: [...p.querySelectorAll('.jp-gpuspawner-warnings li')].map(li => li.textContent),
      panelText: p.innerText
    };
  });
  let closedAt = null;
  if (sample) {
    // close the panel (click its side bar tab): back to the status item's 5 s
    closedAt = Date.now();
    await page.locator('.lm-TabBar-tab[data-id="gpuspawner-gpu-panel"]').click();
    await panel.waitFor({ state: 'hidden', timeout });
    await page.waitForTimeout(11000);
  }
  result.firstError = firstError;
  result.closedAt = closedAt === null ? null : closedAt - openedAt;
  result.pageErrors = consoleErrors;
  // metrics requests in ms relative to the click that opened the panel (sample mode)
  result.metricsRequests = metricsRequests.map(t => t - openedAt);
  console.log(JSON.stringify(result));
} catch (e) {
  console.error(String(e && e.stack ? e.stack : e));
  code = 1;
} finally {
  await browser.close();
}
process.exit(code);
