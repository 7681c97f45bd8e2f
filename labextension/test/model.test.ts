import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';

import {
  budgetLine,
  cullWarning,
  deriveStatus,
  describeFetchError,
  formatBytes,
  gpuRows,
  historySeries,
  parseGpus,
  parseCuller,
  parseMetrics,
  parseOwnUsage,
  parseShare,
  parseTime,
  processRows,
  sessionGpus,
  sparklinePath
} from '../src/model';

const GiB = 1024 ** 3;
const NOW = Date.parse('2026-11-21T12:00:00Z');

function gpusJSON(over: Record<string, unknown> = {}): unknown {
  return {
    state: 'ok',
    message: '',
    allocation: { gpus: ['GPU-a'] },
    gpus: [
      {
        uuid: 'GPU-a',
        index: 0,
        name: 'NVIDIA A100',
        memory_total_bytes: 16 * GiB,
        pci_bus_id: '00000000:3B:00.0',
        numa_node: 0,
        mig: false,
        in_allocation: true
      },
      {
        uuid: 'GPU-b',
        index: 1,
        name: 'NVIDIA A100',
        memory_total_bytes: 16 * GiB,
        pci_bus_id: '00000000:5E:00.0',
        numa_node: 1,
        mig: false,
        in_allocation: false
      }
    ],
    warnings: [],
    culler: null,
    ...over
  };
}

function metricsJSON(over: Record<string, unknown> = {}): unknown {
  return {
    state: 'ok',
    message: '',
    timestamp: '2026-11-21T12:00:04Z',
    gpus: [
      {
        uuid: 'GPU-a',
        utilization_percent: 37.4,
        memory_used_bytes: 3.2 * GiB,
        memory_total_bytes: 16 * GiB,
        temperature_c: 51,
        power_w: 88.5,
        processes: [
          { pid: 10, used_memory_bytes: 1 * GiB, kernel_id: 'k-1234567890' },
          { pid: 11, used_memory_bytes: 2 * GiB, kernel_id: null }
        ]
      },
      {
        uuid: 'GPU-b',
        utilization_percent: 90,
        memory_used_bytes: 10 * GiB,
        memory_total_bytes: 16 * GiB,
        temperature_c: 70,
        power_w: 250,
        processes: [{ pid: 99, used_memory_bytes: 10 * GiB, kernel_id: null }]
      }
    ],
    history: [
      {
        timestamp: '2026-11-21T12:00:02Z',
        gpus: { 'GPU-a': { utilization_percent: 20, memory_used_bytes: 3 * GiB } }
      },
      {
        timestamp: '2026-11-21T12:00:00Z',
        gpus: { 'GPU-a': { utilization_percent: 10, memory_used_bytes: 2 * GiB } }
      }
    ],
    ...over
  };
}

describe('parse', () => {
  it('reads the documented gpus answer', () => {
    const g = parseGpus(gpusJSON());
    assert.equal(g.state, 'ok');
    assert.equal(g.gpus.length, 2);
    assert.equal(g.gpus[0].pci_bus_id, '00000000:3B:00.0');
    assert.equal(g.gpus[1].in_allocation, false);
  });

  it('turns unknown states and bad values into safe ones', () => {
    const g = parseGpus({
      state: 'weird',
      gpus: [{ uuid: 'x', index: 'zero', memory_total_bytes: NaN }, 3],
      warnings: ['w', 4]
    });
    assert.equal(g.state, 'error');
    assert.equal(g.gpus.length, 1);
    assert.equal(g.gpus[0].index, null);
    assert.equal(g.gpus[0].memory_total_bytes, null);
    assert.deepEqual(g.warnings, ['w']);
    assert.equal(g.culler, null);
  });

  it('reads the GPU share the server started with, and nothing from a bad one', () => {
    const share = {
      milli: 250,
      memory_limit_bytes: 20 * GiB,
      mechanism: 'dmem',
      text: '1/4 of an A100: 20 GiB of GPU memory, compute time shared; held by the kernel'
    };
    assert.deepEqual(parseGpus(gpusJSON({ share })).share, share);
    assert.equal(parseGpus(gpusJSON()).share, null);
    assert.equal(parseShare({ ...share, milli: 'a lot' }), null);
    assert.equal(parseShare({ ...share, text: '' }), null);
  });

  it("reads the user's own usage and budgets and words each budget", () => {
    const budget = {
      name: 'default',
      unit: 'gpu_hours',
      used: 12.5,
      limit: 15,
      percent: 83.3,
      renews_at: '2026-12-01T00:00:00+01:00',
      warning: true,
      exceeded: false
    };
    const usage = {
      from: '2026-11-01T00:00:00+01:00',
      gpu_hours: 12.5,
      core_hours: 40,
      budgets: [budget, { name: 'bad', used: 'x' }, 7]
    };
    const got = parseGpus(gpusJSON({ usage })).usage;
    assert.deepEqual(got, { ...usage, budgets: [budget] });
    assert.equal(parseGpus(gpusJSON()).usage, null);
    assert.equal(parseOwnUsage({ gpu_hours: 'lots', core_hours: 1 }), null);
    assert.equal(
      budgetLine(budget),
      'Budget default: 12.5 of 15.0 GPU-hours (83 %), renews 2026-12-01'
    );
    assert.equal(
      budgetLine({ ...budget, unit: 'core_hours', used: 15, exceeded: true }),
      'Budget default is used up: 15.0 of 15.0 core-hours; new spawns are refused until 2026-12-01'
    );
  });

  it('rejects a non-object answer', () => {
    assert.throws(() => parseGpus('<html>'), /not a JSON object/);
    assert.throws(() => parseMetrics(null), /not a JSON object/);
  });

  it('reads metrics, drops processes without a pid, keeps MIG null utilisation', () => {
    const m = parseMetrics({
      state: 'ok',
      timestamp: 1763726400,
      gpus: [
        {
          uuid: 'MIG-1',
          utilization_percent: null,
          memory_used_bytes: 5,
          processes: [{ pid: 'x' }, { pid: 7, used_memory_bytes: null }]
        }
      ],
      history: [
        {
          timestamp: 1763726398.5,
          gpus: { 'MIG-1': { utilization_percent: null, memory_used_bytes: 4 } }
        }
      ]
    });
    assert.equal(m.gpus[0].utilization_percent, null);
    assert.deepEqual(m.gpus[0].processes, [{ pid: 7, used_memory_bytes: null, kernel_id: null }]);
    assert.equal(m.timestamp, 1763726400000);
    assert.equal(m.history[0].timestamp, 1763726398500);
  });

  it('parses times in seconds, milliseconds and ISO', () => {
    assert.equal(parseTime(1763726400), 1763726400000);
    assert.equal(parseTime(1763726400000), 1763726400000);
    assert.equal(parseTime('2026-11-21T12:00:00Z'), NOW);
    assert.equal(parseTime('never'), null);
    assert.equal(parseTime(undefined), null);
  });
});

describe('display values', () => {
  it('formats bytes', () => {
    assert.equal(formatBytes(null), '–');
    assert.equal(formatBytes(512), '512 B');
    assert.equal(formatBytes(300 * 1024 ** 2), '300 MiB');
    assert.equal(formatBytes(16 * GiB), '16.0 GiB');
  });

  it('shows only the allocated GPUs, or all when none is marked', () => {
    const g = parseGpus(gpusJSON());
    assert.deepEqual(
      sessionGpus(g.gpus).map(x => x.uuid),
      ['GPU-a']
    );
    const none = g.gpus.map(x => ({ ...x, in_allocation: false }));
    assert.equal(sessionGpus(none).length, 2);
  });

  it('derives the status text of one allocated GPU', () => {
    const v = deriveStatus(parseGpus(gpusJSON()), parseMetrics(metricsJSON()), null, NOW);
    assert.equal(v.text, 'GPU 37% · 3.2/16.0 GiB');
    assert.equal(v.level, 'ok');
    assert.match(v.title, /#0 NVIDIA A100: 37%/);
  });

  it('averages utilisation and sums memory over several GPUs', () => {
    const g = parseGpus(gpusJSON({ allocation: null }));
    g.gpus.forEach(x => (x.in_allocation = true));
    const v = deriveStatus(g, parseMetrics(metricsJSON()), null, NOW);
    assert.equal(v.text, '2 GPUs 64% · 13.2/32.0 GiB');
  });

  it('shows n/a utilisation on MIG', () => {
    const g = parseGpus(
      gpusJSON({
        gpus: [
          {
            uuid: 'MIG-1',
            index: 0,
            name: 'A100 MIG 1g.10gb',
            memory_total_bytes: 10 * GiB,
            mig: true,
            in_allocation: true
          }
        ]
      })
    );
    const m = parseMetrics({
      state: 'ok',
      gpus: [
        {
          uuid: 'MIG-1',
          utilization_percent: null,
          memory_used_bytes: GiB,
          memory_total_bytes: 10 * GiB,
          processes: []
        }
      ],
      history: []
    });
    const v = deriveStatus(g, m, null, NOW);
    assert.equal(v.text, 'GPU n/a · 1.0/10.0 GiB');
    assert.match(v.title, /MIG: utilisation not available/);
  });

  it('a session placed without GPUs says "no GPU" in neutral colours, not an NVML error', () => {
    const cpu = {
      state: 'no_nvml',
      message: 'NVML Shared Library Not Found',
      gpus: [],
      allocation: { id: 'a1', gpus: [], cpuset: [1] }
    };
    const v = deriveStatus(parseGpus(cpu), null, null, NOW);
    assert.equal(v.text, 'GPU: no GPU');
    assert.equal(v.level, 'idle');
    // with GPUs allocated, a missing NVML is an error
    const gpu = { ...cpu, allocation: { id: 'a2', gpus: [{ uuid: 'GPU-1', milli: 1000 }] } };
    assert.equal(deriveStatus(parseGpus(gpu), null, null, NOW).level, 'error');
  });

  it('names each non-ok state', () => {
    const cases: [string, string, string][] = [
      ['no_nvml', 'GPU: NVML unavailable', 'error'],
      ['no_gpu', 'GPU: no GPU', 'idle'],
      ['permission', 'GPU: no permission', 'error'],
      ['error', 'GPU: error', 'error']
    ];
    for (const [state, text, level] of cases) {
      const v = deriveStatus(
        parseGpus({ state, message: `msg ${state}`, gpus: [] }),
        null,
        null,
        NOW
      );
      assert.equal(v.text, text);
      assert.equal(v.level, level);
      assert.match(v.title, new RegExp(`msg ${state}`));
    }
  });

  it('reports an unreachable server extension', () => {
    const msg = describeFetchError('api/gpuspawner/gpus', 404);
    assert.match(msg, /not installed or not enabled/);
    const v = deriveStatus(null, null, msg, NOW);
    assert.equal(v.text, 'GPU: unavailable');
    assert.equal(v.level, 'error');
    assert.match(describeFetchError('p', 500, 'boom'), /HTTP 500.*boom/);
    assert.match(describeFetchError('p', null, 'offline'), /Could not reach.*offline/);
    assert.equal(deriveStatus(null, null, null, NOW).text, 'GPU: …');
  });

  it('warns when allocation and NVML disagree (server warnings)', () => {
    const g = parseGpus(gpusJSON({ warnings: ['allocation lists GPU-z, NVML does not see it'] }));
    const v = deriveStatus(g, parseMetrics(metricsJSON()), null, NOW);
    assert.equal(v.level, 'warn');
    assert.match(v.title, /GPU-z/);
  });
});

describe('culler', () => {
  it('says when the server will be stopped', () => {
    const w = cullWarning(
      { status: 'warned', cull_at: '2026-11-21T12:15:00Z', reason: 'idle for 45 min' },
      NOW
    );
    assert.equal(
      w,
      'This server will be stopped by the idle culler in 15 min (at 12:15 UTC): idle for 45 min. Save your work.'
    );
    const v = deriveStatus(
      parseGpus(
        gpusJSON({ culler: { status: 'warned', cull_at: '2026-11-21T12:15:00Z', reason: 'idle' } })
      ),
      null,
      null,
      NOW
    );
    assert.equal(v.level, 'warn');
  });

  it("reads the server extension's culler document (an idle culler decision)", () => {
    const g = parseGpus(
      gpusJSON({
        culler: {
          server: {
            user: 'ada',
            server: '',
            action: 'warn',
            reason: 'idle',
            message: 'will be culled at 2026-11-21T12:10:00Z, because no activity for 50 min',
            due: '2026-11-21T12:05:00Z',
            cull_at: '2026-11-21T12:10:00Z',
            figures: {},
            policy: {}
          },
          last_pass: '2026-11-21T11:59:00Z'
        }
      })
    );
    assert.deepEqual(g.culler, {
      status: 'warned',
      cull_at: '2026-11-21T12:10:00Z',
      reason: 'no activity for 50 min'
    });
    assert.equal(
      cullWarning(g.culler, NOW),
      'This server will be stopped by the idle culler in 10 min (at 12:10 UTC): no activity for 50 min. Save your work.'
    );
    const keep = parseCuller({
      server: {
        action: 'keep',
        reason: 'active',
        message: 'next: idle at 2026-11-21T13:00:00Z',
        due: '2026-11-21T13:00:00Z'
      }
    });
    assert.equal(keep?.status, 'ok');
    assert.equal(cullWarning(keep, NOW), null);
    const cull = parseCuller({
      server: {
        action: 'cull',
        reason: 'idle',
        message: 'no activity for 60 min',
        cull_at: '2026-11-21T12:00:00Z'
      }
    });
    assert.match(cullWarning(cull, NOW) ?? '', /is stopping this server now: idle/);
    assert.equal(parseCuller(null), null);
    assert.equal(parseCuller({ server: 'x', status: 'warned' })?.status, 'warned');
  });

  it('is quiet when nothing is scheduled', () => {
    assert.equal(cullWarning(null, NOW), null);
    assert.equal(cullWarning({ status: 'ok', cull_at: null, reason: null }, NOW), null);
    assert.match(
      cullWarning({ status: 'warned', cull_at: '2026-11-21T11:00:00Z', reason: null }, NOW) ?? '',
      /now \(it was due at 11:00 UTC\)/
    );
  });
});

describe('charts and processes', () => {
  it('orders the history and appends the current sample', () => {
    const m = parseMetrics(metricsJSON());
    assert.deepEqual(historySeries(m, 'GPU-a', 'utilization_percent'), [10, 20, 37.4]);
    assert.deepEqual(historySeries(m, 'GPU-b', 'utilization_percent'), [null, null, 90]);
    assert.deepEqual(historySeries(null, 'GPU-a', 'utilization_percent'), []);
  });

  it('draws a sparkline with gaps, right-aligned, clamped', () => {
    assert.equal(sparklinePath([0, 50, 100], 100, 10, 100), 'M0.0 10.0 L50.0 5.0 L100.0 0.0');
    assert.equal(sparklinePath([0, null, 200], 100, 10, 100), 'M0.0 10.0 M100.0 0.0');
    assert.equal(sparklinePath([50], 100, 10, 100, 3), 'M100.0 5.0');
    assert.equal(sparklinePath([], 100, 10, 100), '');
    assert.equal(sparklinePath([1], 100, 10, 0), '');
  });

  it('lists processes of the known GPUs, largest first, with kernel names', () => {
    const rows = processRows(parseGpus(gpusJSON()), parseMetrics(metricsJSON()), {
      'k-1234567890': 'analysis.ipynb'
    });
    assert.deepEqual(
      rows.map(r => [r.gpu, r.pid, r.memory, r.kernel]),
      [
        ['#1', 99, '10.0 GiB', '–'],
        ['#0', 11, '2.0 GiB', '–'],
        ['#0', 10, '1.0 GiB', 'analysis.ipynb']
      ]
    );
    const unnamed = processRows(null, parseMetrics(metricsJSON()));
    assert.equal(unnamed.find(r => r.pid === 10)?.kernel, 'k-123456');
  });

  it('joins static data and samples in index order', () => {
    const g = parseGpus(gpusJSON());
    g.gpus.forEach(x => (x.in_allocation = false));
    const rows = gpuRows(g, null);
    assert.deepEqual(
      rows.map(r => [r.info.index, r.sample, r.memoryTotal]),
      [
        [0, null, 16 * GiB],
        [1, null, 16 * GiB]
      ]
    );
  });
});
