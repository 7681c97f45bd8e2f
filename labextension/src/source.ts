/**
 * One poller shared by the status bar item and the side panel: every 5 s while only the
 * status item is shown, every 2 s while the panel is visible, nothing while the browser tab is
 * hidden (Lumino Poll standby) or nobody is attached.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  describeFetchError,
  GpusResponse,
  MetricsResponse,
  parseGpus,
  parseMetrics
} from './model';

export const GPUS_PATH = 'api/gpuspawner/gpus';
export const METRICS_PATH = 'api/gpuspawner/metrics';

export const STATUS_INTERVAL_MS = 5000;
export const PANEL_INTERVAL_MS = 2000;

class FetchError extends Error {
  constructor(message: string) {
    super(message);
  }
}

async function getJSON(settings: ServerConnection.ISettings, path: string): Promise<unknown> {
  const url = URLExt.join(settings.baseUrl, path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, { method: 'GET' }, settings);
  } catch (e) {
    throw new FetchError(describeFetchError(path, null, String((e as Error)?.message ?? e)));
  }
  if (!response.ok) {
    let detail = '';
    try {
      const body = await response.json();
      detail = typeof body?.message === 'string' ? body.message : '';
    } catch {
      detail = '';
    }
    throw new FetchError(describeFetchError(path, response.status, detail));
  }
  try {
    return await response.json();
  } catch {
    throw new FetchError(`The answer of ${path} is not JSON.`);
  }
}

export class GpuDataSource {
  constructor(settings?: ServerConnection.ISettings) {
    this._settings = settings ?? ServerConnection.makeSettings();
    this._poll = new Poll({
      auto: false,
      factory: () => this.refresh(),
      frequency: { interval: STATUS_INTERVAL_MS, backoff: false },
      name: 'gpuspawner:gpu-data',
      standby: () => (this._users.size === 0 ? true : 'when-hidden')
    });
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }
  get gpus(): GpusResponse | null {
    return this._gpus;
  }
  get metrics(): MetricsResponse | null {
    return this._metrics;
  }
  /** the last request's error message, null after a successful one */
  get error(): string | null {
    return this._error;
  }
  get updatedAt(): number | null {
    return this._updatedAt;
  }

  /**
   * Declare a viewer ('status' or 'panel') visible or not; the poll interval follows the
   * fastest visible viewer and stops when none is.
   */
  setVisible(user: string, visible: boolean): void {
    const before = this._users.size;
    if (visible) {
      this._users.add(user);
    } else {
      this._users.delete(user);
    }
    const interval = this._users.has('panel') ? PANEL_INTERVAL_MS : STATUS_INTERVAL_MS;
    if (this._poll.frequency.interval !== interval) {
      this._poll.frequency = { ...this._poll.frequency, interval };
    }
    if (this._users.size > 0 && (before === 0 || !this._started)) {
      this._started = true;
      void this._poll.start().then(() => this._poll.refresh());
    } else if (visible && user === 'panel') {
      // fresh data at once when the panel opens; the next ticks follow the 2 s interval
      void this._poll.refresh();
    }
  }

  async refresh(): Promise<void> {
    try {
      const [gpus, metrics] = await Promise.all([
        getJSON(this._settings, GPUS_PATH),
        getJSON(this._settings, METRICS_PATH)
      ]);
      this._gpus = parseGpus(gpus);
      this._metrics = parseMetrics(metrics);
      this._error = null;
    } catch (e) {
      this._error = (e as Error).message;
    }
    this._updatedAt = Date.now();
    this._changed.emit();
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  private _settings: ServerConnection.ISettings;
  private _poll: Poll;
  private _users = new Set<string>();
  private _started = false;
  private _gpus: GpusResponse | null = null;
  private _metrics: MetricsResponse | null = null;
  private _error: string | null = null;
  private _updatedAt: number | null = null;
  private _changed = new Signal<this, void>(this);
}
