/**
 * The strings of model.ts go through the translation bundle the plugin passes (JupyterLab's
 * ITranslator, domain gpuspawner): a bundle with a catalogue translates them, arguments in
 * place; without one the strings are as written.
 */
import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';

import {
  cullWarning,
  deriveStatus,
  describeFetchError,
  moveNotice,
  parseGpus,
  stateText,
  Trans,
  untranslated
} from '../src/model';

const NOW = Date.parse('2026-11-21T12:00:00Z');

/** a gettext bundle with a small German catalogue; unknown msgids stay as written */
function catalogue(entries: Record<string, string>): Trans & { asked: string[] } {
  const asked: string[] = [];
  const fmt = (msg: string, args: unknown[]) =>
    msg.replace(/%(\d+)/g, (_m, i: string) => String(args[Number(i) - 1]));
  return {
    asked,
    __: (msgid, ...args) => {
      asked.push(msgid);
      return fmt(entries[msgid] ?? msgid, args);
    },
    _n: (one, many, n, ...args) => {
      asked.push(one);
      return fmt(entries[n === 1 ? one : many] ?? (n === 1 ? one : many), [n, ...args]);
    }
  };
}

describe('translation', () => {
  it('fills the arguments without a translator', () => {
    assert.equal(untranslated.__('a %1 b %2', 'x', 3), 'a x b 3');
    assert.equal(untranslated._n('GPU', '%1 GPUs', 2), '2 GPUs');
    assert.equal(untranslated._n('GPU', '%1 GPUs', 1), 'GPU');
    assert.equal(untranslated.__('literal %3 stays', 'x'), 'literal %3 stays');
  });

  it('translates the status, the culler warning and errors through the bundle', () => {
    const de = catalogue({
      'GPU: %1': 'GPU: %1',
      'no GPU': 'keine GPU',
      'Loading GPU data': 'GPU-Daten werden geladen',
      'This server will be stopped by the idle culler%1%2. Save your work.':
        'Dieser Server wird vom Idle-Culler gestoppt%1%2. Sichern Sie Ihre Arbeit.',
      ' in %1 min (at %2 UTC)': ' in %1 Min. (um %2 UTC)',
      'Not allowed to read GPU data (HTTP %1 for %2).':
        'Keine Berechtigung für GPU-Daten (HTTP %1 für %2).'
    });
    assert.equal(stateText('no_gpu', de), 'keine GPU');
    assert.equal(
      deriveStatus(null, null, null, NOW, undefined, de).title,
      'GPU-Daten werden geladen'
    );
    const warning = cullWarning(
      { status: 'warned', cull_at: '2026-11-21T12:10:00Z', reason: 'idle' },
      NOW,
      de
    );
    assert.equal(
      warning,
      'Dieser Server wird vom Idle-Culler gestoppt in 10 Min. (um 12:10 UTC): idle. Sichern Sie Ihre Arbeit.'
    );
    assert.equal(
      describeFetchError('api/gpuspawner/gpus', 403, '', de),
      'Keine Berechtigung für GPU-Daten (HTTP 403 für api/gpuspawner/gpus).'
    );
    const g = parseGpus({
      state: 'no_gpu',
      message: '',
      allocation: null,
      gpus: [],
      warnings: [],
      culler: null
    });
    const v = deriveStatus(g, null, null, NOW, undefined, de);
    assert.ok(de.asked.length > 0);
    assert.match(v.text, /^GPU: /);
  });

  it('asks the bundle for the move notice', () => {
    const de = catalogue({});
    const n = moveNotice({ from: 'node1', to: 'node2', at: NOW / 1000, reason: 'node1 down' }, de);
    assert.ok(n);
    assert.ok(de.asked.some(m => m.startsWith('Your server moved from node %1 to node %2')));
    assert.match(n.message, /from node node1 to node node2 at 2026-11-21 12:00 UTC/);
  });
});
