/**
 * The idle culler's warning for this server as a JupyterLab notification (the notification
 * center of JupyterLab >= 4.1, through its commands `apputils:notify`,
 * `apputils:update-notification` and `apputils:dismiss-notification`, so no other package is
 * needed): shown once per scheduled cull, its text (time left, reason) updated as the data
 * refreshes (also when a warning turns into "culling"), dismissed when the culler no longer
 * plans to stop the server. Does nothing where
 * those commands are missing or the `cullNotifications` setting is off.
 */
import type { JupyterFrontEnd } from '@jupyterlab/application';

import { cullNotice, GpusResponse, moveNotice, Trans, untranslated, ViewSettings } from './model';

/** What the notifier reads of the data source (GpuDataSource in src/source.ts). */
export interface CullSource {
  readonly gpus: GpusResponse | null;
  readonly settings: ViewSettings;
  readonly changed: { connect(slot: () => void): unknown };
}

export const NOTIFY = 'apputils:notify';
export const UPDATE = 'apputils:update-notification';
export const DISMISS = 'apputils:dismiss-notification';

/**
 * A notifier driven by the data source: each change of the source calls `update()`, and the
 * calls run one after the other (a notification is only shown, updated or dismissed once the
 * previous call is done).
 */
abstract class SerialNotifier {
  /** `trans`: the extension's translation bundle, for the notifications' text */
  constructor(
    commands: JupyterFrontEnd['commands'],
    source: CullSource,
    trans: Trans = untranslated
  ) {
    this._commands = commands;
    this._source = source;
    this._trans = trans;
    source.changed.connect(() => void this.update());
  }

  /** Bring the notification up to date with the source; one call at a time. */
  update(): Promise<void> {
    this._chain = this._chain.then(
      () => this._update(),
      () => this._update()
    );
    return this._chain;
  }

  protected abstract _update(): Promise<void>;

  private _chain: Promise<void> = Promise.resolve();
  protected _commands: JupyterFrontEnd['commands'];
  protected _source: CullSource;
  protected _trans: Trans;
}

/**
 * The culler's notification: shown, updated or dismissed for the source's current culler
 * status. An existing notification is updated in place, never dismissed and shown again:
 * quick dismiss/notify cycles made the notification toasts' React tree insert into a node it
 * had just removed ("insertBefore" NotFoundError in the page).
 */
export class CullNotifier extends SerialNotifier {
  protected async _update(): Promise<void> {
    if (!this._commands.hasCommand(NOTIFY)) {
      return;
    }
    const src = this._source;
    if (src.gpus === null) {
      return; // no answer yet (or a failed poll): keep what is shown
    }
    const notice = src.settings.cullNotifications
      ? cullNotice(src.gpus.culler ?? null, Date.now(), this._trans)
      : null;
    if (notice === null) {
      if (this._id !== null) {
        const id = this._id;
        this._id = this._key = this._message = null;
        await this._commands.execute(DISMISS, { id });
      }
      return;
    }
    if (this._id === null) {
      this._key = notice.key;
      this._message = notice.message;
      this._id = (await this._commands.execute(NOTIFY, {
        message: notice.message,
        type: notice.type,
        options: { autoClose: false }
      })) as string;
    } else if (notice.key !== this._key || notice.message !== this._message) {
      this._key = notice.key;
      this._message = notice.message;
      await this._commands.execute(UPDATE, {
        id: this._id,
        message: notice.message,
        type: notice.type,
        autoClose: false
      });
    }
  }

  private _id: string | null = null;
  private _key: string | null = null;
  private _message: string | null = null;
}

/** Where a move already told is remembered (per move key), so a reload does not repeat it. */
export interface SeenStore {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
}

export const SEEN_PREFIX = 'gpuspawner:move-told:';

/**
 * Tells the user, once, that the hub restarted this server on another node because its node
 * failed (the gpus answer's `moved`): a warning notification that stays until dismissed.
 * Remembered in `seen` (the browser's localStorage by default) so reloading JupyterLab does
 * not tell it again. Does nothing where the notification commands are missing.
 */
export class MoveNotifier extends SerialNotifier {
  constructor(
    commands: JupyterFrontEnd['commands'],
    source: CullSource,
    seen?: SeenStore | null,
    trans: Trans = untranslated
  ) {
    super(commands, source, trans);
    this._seen = seen === undefined ? defaultStore() : seen;
  }

  protected async _update(): Promise<void> {
    if (!this._commands.hasCommand(NOTIFY) || this._source.gpus === null) {
      return;
    }
    const notice = moveNotice(this._source.gpus.moved, this._trans);
    if (notice === null || notice.key === this._told) {
      return;
    }
    const key = SEEN_PREFIX + notice.key;
    this._told = notice.key;
    try {
      if (this._seen?.getItem(key)) {
        return;
      }
      this._seen?.setItem(key, '1');
    } catch {
      // storage refused (private window, quota): tell it, once per page
    }
    await this._commands.execute(NOTIFY, {
      message: notice.message,
      type: 'warning',
      options: { autoClose: false }
    });
  }

  private _seen: SeenStore | null;
  private _told: string | null = null;
}

function defaultStore(): SeenStore | null {
  try {
    return (globalThis as { localStorage?: SeenStore }).localStorage ?? null;
  } catch {
    return null;
  }
}
