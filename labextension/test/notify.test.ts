// The idle culler's warning as a JupyterLab notification (src/notify.ts) and the status item's
// visibility in sessions without a GPU (statusItemVisible), against a fake command registry
// and a fake data source: what is emitted, updated and dismissed.
import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';

import {
  cullNotice,
  CullerStatus,
  MoveRecord,
  moveNotice,
  NOTIFICATION_MAX,
  DEFAULT_SETTINGS,
  GpusResponse,
  parseGpus,
  statusItemVisible,
  ViewSettings
} from '../src/model';
import { CullNotifier, DISMISS, MoveNotifier, NOTIFY, SEEN_PREFIX, UPDATE } from '../src/notify';

type Call = [string, Record<string, unknown>];

class FakeCommands {
  calls: Call[] = [];
  present = true;
  hasCommand(id: string): boolean {
    return this.present && [NOTIFY, UPDATE, DISMISS].includes(id);
  }
  async execute(id: string, args: Record<string, unknown>): Promise<unknown> {
    this.calls.push([id, args]);
    return id === NOTIFY ? `n${this.calls.length}` : true;
  }
}

class FakeSource {
  culler: CullerStatus | null = null;
  moved: unknown = null;
  settings: ViewSettings = DEFAULT_SETTINGS;
  private _slots: (() => void)[] = [];
  get gpus(): GpusResponse {
    return { ...parseGpus({ state: 'ok', gpus: [], moved: this.moved }), culler: this.culler };
  }
  changed = { connect: (f: () => void) => this._slots.push(f) };
}

function inMinutes(m: number): string {
  return new Date(Date.now() + m * 60000 + 10000).toISOString();
}

describe('cull notifications', () => {
  it('notifies once per scheduled cull, updates the time left, dismisses when cancelled', async () => {
    const commands = new FakeCommands();
    const source = new FakeSource();

    const n = new CullNotifier(commands as any, source);
    await n.update();
    assert.equal(commands.calls.length, 0);
    const at = inMinutes(15);
    source.culler = { status: 'warned', cull_at: at, reason: 'idle for 45 min' };
    await n.update();
    assert.equal(commands.calls.length, 1);
    const [id, args] = commands.calls[0];
    assert.equal(id, NOTIFY);
    assert.equal(args.type, 'warning');
    assert.match(String(args.message), /stopped by the idle culler in 15 min .*: idle for 45 min/);
    assert.deepEqual(args.options, { autoClose: false });
    await n.update(); // same warning, same text: nothing new
    assert.equal(commands.calls.length, 1);
    // the culler now stops it: the same notification turns into an error (updated in place)
    source.culler = { status: 'culling', cull_at: at, reason: 'idle for 60 min' };
    await n.update();
    assert.equal(commands.calls[1][0], UPDATE);
    assert.equal(commands.calls[1][1].id, 'n1');
    assert.equal(commands.calls[1][1].type, 'error');
    // activity came back: dismissed
    source.culler = { status: 'active', cull_at: null, reason: null };
    await n.update();
    assert.deepEqual(commands.calls[2], [DISMISS, { id: 'n1' }]);
    assert.equal(commands.calls.length, 3);
  });

  it('runs calls one after the other: two refreshes at once show one notification', async () => {
    const commands = new FakeCommands();
    const source = new FakeSource();
    const n = new CullNotifier(commands as any, source);
    source.culler = { status: 'warned', cull_at: inMinutes(15), reason: 'idle' };
    await Promise.all([n.update(), n.update(), n.update()]);
    assert.deepEqual(
      commands.calls.map(c => c[0]),
      [NOTIFY]
    );
  });

  it('updates the text when only the time left changes', async () => {
    const commands = new FakeCommands();
    const source = new FakeSource();

    const n = new CullNotifier(commands as any, source);
    source.culler = { status: 'warned', cull_at: inMinutes(15), reason: 'idle' };
    await n.update();

    (n as any)._message = 'an older text';
    await n.update();
    assert.equal(commands.calls[1][0], UPDATE);
    assert.equal(commands.calls[1][1].id, 'n1');
  });

  it('does nothing when the setting is off or JupyterLab has no notifications', async () => {
    const commands = new FakeCommands();
    const source = new FakeSource();
    source.culler = { status: 'warned', cull_at: inMinutes(5), reason: 'idle' };
    source.settings = { ...DEFAULT_SETTINGS, cullNotifications: false };

    await new CullNotifier(commands as any, source).update();
    source.settings = DEFAULT_SETTINGS;
    commands.present = false;

    await new CullNotifier(commands as any, source).update();
    assert.equal(commands.calls.length, 0);
    assert.equal(cullNotice({ status: 'exempt', cull_at: null, reason: null }), null);
  });
});

describe('status item without a GPU', () => {
  const cpu = parseGpus({
    state: 'no_nvml',
    message: 'NVML Shared Library Not Found',
    gpus: [],
    allocation: { id: 'a1', gpus: [], cpuset: [1] }
  });
  const hide = { ...DEFAULT_SETTINGS, showWithoutGpu: false };
  it('shows by default and hides by the setting', () => {
    assert.equal(statusItemVisible(cpu, null), true);
    assert.equal(statusItemVisible(cpu, null, hide), false);
    assert.equal(statusItemVisible(parseGpus({ state: 'no_gpu', gpus: [] }), null, hide), false);
  });
  it('stays for GPU sessions, errors and while loading', () => {
    const gpu = parseGpus({
      state: 'no_nvml',
      gpus: [],
      allocation: { id: 'a2', gpus: [{ uuid: 'GPU-1', milli: 1000 }] }
    });
    assert.equal(statusItemVisible(gpu, null, hide), true);
    assert.equal(statusItemVisible(null, null, hide), true);
    assert.equal(statusItemVisible(cpu, 'the server extension did not answer', hide), true);
  });
});

class MapStore {
  items = new Map<string, string>();
  getItem(key: string): string | null {
    return this.items.get(key) ?? null;
  }
  setItem(key: string, value: string): void {
    this.items.set(key, value);
  }
}

describe('move notifications', () => {
  const move: MoveRecord = {
    from: 'gpu-a',
    to: 'gpu-b',
    at: 1764000000,
    reason: 'node gpu-a is down'
  };

  it('words the move within the 140 characters JupyterLab shows, the reason where it fits', () => {
    const n = moveNotice(move);
    assert.equal(
      n?.message,
      'Your server moved from node gpu-a to node gpu-b at 2025-11-24 16:00 UTC. Files in your ' +
        'home are safe; running kernels were lost.'
    );
    const short = moveNotice({ ...move, from: 'a', to: 'b', reason: 'a is down' });
    assert.match(String(short?.message), / were lost\. Why: a is down\.$/);
    assert.ok(String(short?.message).length <= NOTIFICATION_MAX);
    assert.equal(moveNotice(null), null);
  });

  it('tells a move once, also across reloads; a malformed record tells nothing', async () => {
    const commands = new FakeCommands();
    const source = new FakeSource();
    const store = new MapStore();
    const n = new MoveNotifier(commands as any, source, store);
    await n.update();
    assert.equal(commands.calls.length, 0); // a server the user started
    source.moved = { from: 'gpu-a' }; // malformed: nothing
    await n.update();
    assert.equal(commands.calls.length, 0);
    source.moved = move;
    await Promise.all([n.update(), n.update()]); // two refreshes at once: told once
    assert.equal(commands.calls.length, 1);
    const [id, args] = commands.calls[0];
    assert.equal(id, NOTIFY);
    assert.equal(args.type, 'warning');
    assert.deepEqual(args.options, { autoClose: false });
    assert.match(String(args.message), /^Your server moved from node gpu-a to node gpu-b/);
    assert.equal(store.getItem(SEEN_PREFIX + 'gpu-a|gpu-b|1764000000'), '1');
    // JupyterLab reloaded (a new notifier, the same browser storage): not told again
    const again = new MoveNotifier(commands as any, source, store);
    await again.update();
    assert.equal(commands.calls.length, 1);
    // a second move (back to gpu-a) is told
    source.moved = { ...move, from: 'gpu-b', to: 'gpu-a', at: move.at + 600 };
    await again.update();
    assert.equal(commands.calls.length, 2);
  });

  it('does nothing without the notification commands', async () => {
    const commands = new FakeCommands();
    commands.present = false;
    const source = new FakeSource();
    source.moved = move;
    await new MoveNotifier(commands as any, source, new MapStore()).update();
    assert.equal(commands.calls.length, 0);
  });
});
