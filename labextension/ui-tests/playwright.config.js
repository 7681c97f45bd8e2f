/**
 * Galata (Playwright) UI tests of gpuspawner-labextension, in Debian's Chromium.
 *
 * Galata's default configuration, plus:
 * - the browser is $CHROMIUM (default /usr/bin/chromium, `make test-tools`): no Playwright
 *   browser download; no video (it needs Playwright's own ffmpeg);
 * - two JupyterLab servers from this checkout's venv (../../.venv, or $JUPYTER), each with the
 *   gpuviews server extension answering from an NVML test double (tests/test_gpuviews_nvml.py):
 *   project "gpu" (two fake A100s, $GALATA_PORT_GPU) and project "cpu-only" (no NVML, an
 *   allocation without GPUs, $GALATA_PORT_CPU).
 */
const fs = require('fs');
const os = require('os');
const path = require('path');

const baseConfig = require('@jupyterlab/galata/lib/playwright-config');

const REPO = path.resolve(__dirname, '..', '..');
const JUPYTER = process.env.JUPYTER || path.join(REPO, '.venv', 'bin', 'jupyter');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const PORT_GPU = Number(process.env.GALATA_PORT_GPU || 18888);
const PORT_CPU = Number(process.env.GALATA_PORT_CPU || 18889);

function server(port, env) {
  // own Jupyter dirs: nothing from the user's ~/.jupyter or ~/.local/share/jupyter
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'gpuspawner-galata-'));
  return {
    command: `"${JUPYTER}" lab --config jupyter_server_test_config.py --allow-root`,
    cwd: __dirname,
    url: `http://127.0.0.1:${port}/lab`,
    timeout: 120 * 1000,
    reuseExistingServer: false,
    stdout: 'ignore',
    stderr: 'pipe',
    env: {
      ...process.env,
      GALATA_PORT: String(port),
      JUPYTER_CONFIG_DIR: path.join(home, 'config'),
      JUPYTER_DATA_DIR: path.join(home, 'data'),
      JUPYTER_RUNTIME_DIR: path.join(home, 'runtime'),
      JUPYTER_PLATFORM_DIRS: '1',
      // this checkout's gpuspawner package and tests/ (the NVML doubles)
      PYTHONPATH: [REPO, process.env.PYTHONPATH].filter(Boolean).join(path.delimiter),
      ...env
    }
  };
}

module.exports = {
  ...baseConfig,
  reporter: [['list'], ['json', { outputFile: 'playwright-report/results.json' }]],
  retries: 0,
  workers: 1,
  forbidOnly: !!process.env.CI,
  // the whole run, servers' start included, is bounded (the pytest wrapper allows 540 s)
  globalTimeout: 8 * 60 * 1000,
  use: {
    ...baseConfig.use,
    launchOptions: { executablePath: CHROMIUM },
    trace: 'retain-on-failure',
    video: 'off'
  },
  projects: [
    {
      name: 'gpu',
      testMatch: /gpu\.spec\.ts$/,
      use: { baseURL: `http://127.0.0.1:${PORT_GPU}` }
    },
    {
      name: 'cpu-only',
      testMatch: /cpu-only\.spec\.ts$/,
      use: { baseURL: `http://127.0.0.1:${PORT_CPU}` }
    }
  ],
  webServer: [
    server(PORT_GPU, {
      GPUSPAWNER_NVML_FACTORY: 'tests.test_gpuviews_nvml:metrics_double'
    }),
    server(PORT_CPU, {
      GPUSPAWNER_NVML_FACTORY: 'tests.test_gpuviews_nvml:no_nvml_double',
      GPUSPAWNER_ALLOCATION: JSON.stringify({ id: 'cpu-only', node: 'local', gpus: [] })
    })
  ]
};
