/**
 * One poller shared by the status bar item and the side panel: every `statusPollInterval` ms
 * (default 5 s) while only the status item is shown, every `pollInterval` ms (default 2 s)
 * while the panel is visible, nothing while the browser tab is hidden (Lumino Poll standby) or
 * nobody is attached. The intervals come from the user settings (schema/plugin.json) and
 * change live (configure).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  DEFAULT_SETTINGS,
  describeFetchError,
  GpusResponse,
  MAX_POLL_INTERVAL_MS,
  MetricsResponse,
  parseGpus,
  parseMetrics,
  pollIntervalFor,
  Trans,
  untranslated,
  ViewSettings
} from './model';

export const GPUS_PATH = 'api/gpuspawner/gpus';
export const METRICS_PATH = 'api/gpuspawner/metrics';

export const STATUS_INTERVAL_MS = DEFAULT_SETTINGS.statusPollInterval;
export const PANEL_INTERVAL_MS = DEFAULT_SETTINGS.pollInterval;

class FetchError extends Error {
  constructor(message: string) {
    super(message);
  }
}

async function getJSON(
  settings: ServerConnection.ISettings,
  path: string,
  trans: Trans
): Promise<unknown> {
  const url = URLExt.join(settings.baseUrl, path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, { method: 'GET' }, settings);
  } catch (e) {
    throw new FetchError(describeFetchError(path, null, String((e as Error)?.message ?? e), trans));
  }
  if (!response.ok) {
    let detail = '';
    try {
      const body = await response.json();
      detail = typeof body?.message === 'string' ? body.message : '';
    } catch {
      detail = '';
    }
    throw new FetchError(describeFetchError(path, response.status, detail, trans));
  }
  try {
    return await response.json();
  } catch {
    throw new FetchError(trans.__('The answer of %1 is not JSON.', path));
  }
}

export class GpuDataSource {
  /** `trans`: the extension's translation bundle, for the error messages it makes */
  constructor(settings?: ServerConnection.ISettings, trans: Trans = untranslated) {
    this._settings = settings ?? ServerConnection.makeSettings();
    this._trans = trans;
    this._poll = new Poll<void, unknown, 'rescheduled'>({
      auto: false,
      factory: () => this.refresh(),
      frequency: { interval: STATUS_INTERVAL_MS, backoff: false, max: MAX_POLL_INTERVAL_MS },
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
  /** the settings in effect (schema/plugin.json; the defaults until configure) */
  get settings(): ViewSettings {
    return this._viewSettings;
  }
  /** the current poll interval in ms */
  get interval(): number {
    return this._poll.frequency.interval;
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
    this._applyInterval();
    if (this._users.size > 0 && (before === 0 || !this._started)) {
      this._started = true;
      void this._poll.start().then(() => this._poll.refresh());
    } else if (visible && user === 'panel') {
      // fresh data at once when the panel opens; the next ticks follow the panel's interval
      void this._poll.refresh();
    }
  }

  /**
   * Apply new settings: the views re-render (units, GPU selection) and a changed interval
   * takes effect at once: the pending tick, scheduled with the old interval, is replaced by
   * one the new interval away.
   */
  configure(settings: ViewSettings): void {
    this._viewSettings = settings;
    if (this._applyInterval() && this._started && this._users.size > 0) {
      void this._poll.schedule({
        interval: this._poll.frequency.interval,
        phase: 'rescheduled'
      });
    }
    this._changed.emit();
  }

  /** Set the poll's interval for the visible viewers; true when it changed. */
  private _applyInterval(): boolean {
    const interval = pollIntervalFor(this._users.has('panel'), this._viewSettings);
    if (this._poll.frequency.interval === interval) {
      return false;
    }
    this._poll.frequency = { ...this._poll.frequency, interval };
    return true;
  }

  async refresh(): Promise<void> {
    try {
      const [gpus, metrics] = await Promise.all([
        getJSON(this._settings, GPUS_PATH, this._trans),
        getJSON(this._settings, METRICS_PATH, this._trans)
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
  private _trans: Trans;
  private _poll: Poll<void, unknown, 'rescheduled'>;
  private _users = new Set<string>();
  private _viewSettings: ViewSettings = DEFAULT_SETTINGS;
  private _started = false;
  private _gpus: GpusResponse | null = null;
  private _metrics: MetricsResponse | null = null;
  private _error: string | null = null;
  private _updatedAt: number | null = null;
  private _changed = new Signal<this, void>(this);
}
