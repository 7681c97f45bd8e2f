// The user settings (schema/plugin.json) as the views read them: parseSettings, the poll
// interval, the GPU selection and the memory units. Pure functions of src/model.ts.
import { strict as assert } from 'node:assert';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';

import {
  DEFAULT_SETTINGS,
  deriveStatus,
  formatMemory,
  gpuRows,
  MAX_POLL_INTERVAL_MS,
  MEMORY_UNITS,
  MIN_POLL_INTERVAL_MS,
  parseGpus,
  parseMetrics,
  parseSettings,
  pollIntervalFor,
  processRows,
  selectGpus
} from '../src/model';

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
const NOW = Date.parse('2026-11-21T12:00:00Z');

// npm test runs in labextension/
const schema = JSON.parse(readFileSync(join(process.cwd(), 'schema', 'plugin.json'), 'utf8'));

const gpus = parseGpus({
  state: 'ok',
  message: '',
  allocation: { gpus: ['GPU-a'] },
  gpus: [
    { uuid: 'GPU-a', index: 0, name: 'A100', memory_total_bytes: 16 * GiB, in_allocation: true },
    { uuid: 'GPU-b', index: 1, name: 'A100', memory_total_bytes: 16 * GiB, in_allocation: false },
    { uuid: 'GPU-c', index: 2, name: 'T4', memory_total_bytes: 16 * GiB, in_allocation: true }
  ],
  warnings: [],
  culler: null
});
const metrics = parseMetrics({
  state: 'ok',
  timestamp: NOW,
  gpus: [
    {
      uuid: 'GPU-a',
      utilization_percent: 40,
      memory_used_bytes: 4 * GiB,
      memory_total_bytes: 16 * GiB,
      processes: [{ pid: 1, used_memory_bytes: 512 * MiB, kernel_id: null }]
    },
    {
      uuid: 'GPU-b',
      utilization_percent: 90,
      memory_used_bytes: 8 * GiB,
      memory_total_bytes: 16 * GiB,
      processes: [{ pid: 2, used_memory_bytes: 8 * GiB, kernel_id: null }]
    },
    {
      uuid: 'GPU-c',
      utilization_percent: 10,
      memory_used_bytes: 2 * GiB,
      memory_total_bytes: 16 * GiB,
      processes: [{ pid: 3, used_memory_bytes: 2 * GiB, kernel_id: null }]
    }
  ],
  history: []
});

describe('settings schema', () => {
  it('has the defaults the code uses and no other property', () => {
    const props = schema.properties;
    assert.deepEqual(Object.keys(props).sort(), Object.keys(DEFAULT_SETTINGS).sort());
    for (const [k, v] of Object.entries(DEFAULT_SETTINGS)) {
      assert.deepEqual(props[k].default, v, k);
    }
    assert.equal(schema.additionalProperties, false);
    assert.equal(props.pollInterval.minimum, MIN_POLL_INTERVAL_MS);
    assert.equal(props.statusPollInterval.minimum, MIN_POLL_INTERVAL_MS);
    assert.equal(props.pollInterval.maximum, MAX_POLL_INTERVAL_MS);
    assert.deepEqual(
      props.units.oneOf.map((o: { const: string }) => o.const),
      MEMORY_UNITS
    );
    assert.ok(schema.title && schema.description);
    assert.ok(schema['jupyter.lab.setting-icon']);
  });

  it('the schema defaults parse to DEFAULT_SETTINGS', () => {
    const composite = Object.fromEntries(
      Object.entries(schema.properties).map(([k, v]) => [k, (v as { default: unknown }).default])
    );
    assert.deepEqual(parseSettings(composite), DEFAULT_SETTINGS);
  });
});

describe('parseSettings', () => {
  it('gives the defaults for nothing or garbage', () => {
    assert.deepEqual(parseSettings(undefined), DEFAULT_SETTINGS);
    assert.deepEqual(parseSettings([1, 2]), DEFAULT_SETTINGS);
    assert.deepEqual(
      parseSettings({ pollInterval: 'fast', statusPollInterval: NaN, gpus: 'all', units: 'TB' }),
      DEFAULT_SETTINGS
    );
  });

  it('clamps intervals to [500 ms, 1 h] and rounds them', () => {
    const s = parseSettings({ pollInterval: 10, statusPollInterval: 1e12 });
    assert.equal(s.pollInterval, MIN_POLL_INTERVAL_MS);
    assert.equal(s.statusPollInterval, MAX_POLL_INTERVAL_MS);
    assert.equal(parseSettings({ pollInterval: 1234.6 }).pollInterval, 1235);
  });

  it('keeps GPU entries as trimmed strings, numbers as indices, without duplicates', () => {
    const s = parseSettings({ gpus: [' 1 ', 1, 'GPU-c', '', null, -1, 2.5, 'GPU-c'] });
    assert.deepEqual(s.gpus, ['1', 'GPU-c']);
  });

  it('accepts each of the units', () => {
    for (const u of MEMORY_UNITS) {
      assert.equal(parseSettings({ units: u }).units, u);
    }
  });
});

describe('poll interval', () => {
  it('follows the panel setting while the panel is visible, else the status one', () => {
    const s = parseSettings({ pollInterval: 750, statusPollInterval: 9000 });
    assert.equal(pollIntervalFor(true, s), 750);
    assert.equal(pollIntervalFor(false, s), 9000);
    assert.equal(pollIntervalFor(true, DEFAULT_SETTINGS), 2000);
    assert.equal(pollIntervalFor(false, DEFAULT_SETTINGS), 5000);
  });
});

describe('GPU selection', () => {
  it('shows the session GPUs without a selection', () => {
    assert.deepEqual(
      selectGpus(gpus.gpus).map(g => g.uuid),
      ['GPU-a', 'GPU-c']
    );
  });

  it('selects by index or UUID (case-insensitive), among all reported GPUs', () => {
    assert.deepEqual(
      selectGpus(gpus.gpus, ['1']).map(g => g.uuid),
      ['GPU-b']
    );
    assert.deepEqual(
      selectGpus(gpus.gpus, ['gpu-c', '0']).map(g => g.uuid),
      ['GPU-a', 'GPU-c']
    );
    assert.deepEqual(selectGpus(gpus.gpus, ['7', 'GPU-z']), []);
  });

  it('drives the rows, the status text and the processes', () => {
    const s = parseSettings({ gpus: ['1'] });
    assert.deepEqual(
      gpuRows(gpus, metrics, s.gpus).map(r => r.info.uuid),
      ['GPU-b']
    );
    const v = deriveStatus(gpus, metrics, null, NOW, s);
    assert.equal(v.text, 'GPU 90% · 8.0/16.0 GiB');
    assert.deepEqual(
      processRows(gpus, metrics, {}, s).map(p => p.pid),
      [2]
    );
    // default: the session's two GPUs (mean utilisation, summed memory), their processes
    assert.equal(deriveStatus(gpus, metrics, null, NOW).text, '2 GPUs 25% · 6.0/32.0 GiB');
    assert.deepEqual(
      processRows(gpus, metrics)
        .map(p => p.pid)
        .sort(),
      [1, 2, 3]
    );
  });

  it('says so when no selected GPU is in the session', () => {
    const v = deriveStatus(gpus, metrics, null, NOW, parseSettings({ gpus: ['5'] }));
    assert.equal(v.text, 'GPU: none selected');
    assert.match(v.title, /\(5\)/);
    assert.equal(v.level, 'idle');
  });
});

describe('memory units', () => {
  it('formats used/total in each unit, compact and not', () => {
    const used = 3.2 * GiB;
    const total = 16 * GiB;
    assert.equal(formatMemory(used, total, 'auto', true), '3.2/16.0 GiB');
    assert.equal(formatMemory(used, total, 'auto'), '3.2 GiB / 16.0 GiB');
    assert.equal(formatMemory(used, total, 'GiB', true), '3.2/16.0 GiB');
    assert.equal(formatMemory(used, total, 'MiB', true), '3277/16384 MiB');
    assert.equal(formatMemory(used, total, 'MiB'), '3277 MiB / 16384 MiB');
    assert.equal(formatMemory(used, total, 'percent', true), 'mem 20%');
    assert.equal(formatMemory(used, total, 'percent'), '20% of 16.0 GiB');
    assert.equal(formatMemory(512 * MiB, total, 'auto', true), '512 MiB/16.0 GiB');
    assert.equal(formatMemory(100 * MiB, total, 'GiB', true), '0.1/16.0 GiB');
  });

  it('handles unknown values', () => {
    assert.equal(formatMemory(null, 16 * GiB, 'percent', true), '16.0 GiB');
    assert.equal(formatMemory(null, 16 * GiB, 'MiB', true), '16384 MiB');
    assert.equal(formatMemory(GiB, null, 'percent', true), '1.0 GiB/–');
    assert.equal(formatMemory(null, null, 'auto'), '–');
  });

  it('applies to the status bar, its tooltip and the process table', () => {
    const s = parseSettings({ units: 'MiB', gpus: ['0'] });
    const v = deriveStatus(gpus, metrics, null, NOW, s);
    assert.equal(v.text, 'GPU 40% · 4096/16384 MiB');
    assert.match(v.title, /4096 MiB \/ 16384 MiB/);
    assert.equal(processRows(gpus, metrics, {}, s)[0].memory, '512 MiB');
    const p = deriveStatus(
      gpus,
      metrics,
      null,
      NOW,
      parseSettings({ units: 'percent', gpus: ['0'] })
    );
    assert.equal(p.text, 'GPU 40% · mem 25%');
    // percent of a process's memory is not meaningful: auto units there
    assert.equal(
      processRows(gpus, metrics, {}, parseSettings({ units: 'percent' }))[0].memory,
      '8.0 GiB'
    );
  });
});
