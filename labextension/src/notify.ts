/**
 * The idle culler's warning for this server as a JupyterLab notification (the notification
 * center of JupyterLab >= 4.1, through its commands `apputils:notify`,
 * `apputils:update-notification` and `apputils:dismiss-notification`, so no other package is
 * needed): shown once per scheduled cull, its text (time left, reason) updated as the data
 * refreshes, dismissed when the culler no longer plans to stop the server. Does nothing where
 * those commands are missing or the `cullNotifications` setting is off.
 */
import type { JupyterFrontEnd } from '@jupyterlab/application';

import { cullNotice, GpusResponse, ViewSettings } from './model';

/** What the notifier reads of the data source (GpuDataSource in src/source.ts). */
export interface CullSource {
  readonly gpus: GpusResponse | null;
  readonly settings: ViewSettings;
  readonly changed: { connect(slot: () => void): unknown };
}

export const NOTIFY = 'apputils:notify';
export const UPDATE = 'apputils:update-notification';
export const DISMISS = 'apputils:dismiss-notification';

export class CullNotifier {
  constructor(commands: JupyterFrontEnd['commands'], source: CullSource) {
    this._commands = commands;
    this._source = source;
    source.changed.connect(() => void this.update());
  }

  /** Show, update or dismiss the notification for the source's current culler status. */
  async update(): Promise<void> {
    if (!this._commands.hasCommand(NOTIFY)) {
      return;
    }
    const src = this._source;
    const notice = src.settings.cullNotifications ? cullNotice(src.gpus?.culler ?? null) : null;
    if (notice === null || notice.key !== this._key) {
      if (this._id !== null) {
        const id = this._id;
        this._id = null;
        this._key = null;
        this._message = null;
        await this._commands.execute(DISMISS, { id });
      }
      if (notice === null) {
        return;
      }
      this._key = notice.key;
      this._message = notice.message;
      this._id = (await this._commands.execute(NOTIFY, {
        message: notice.message,
        type: notice.type,
        options: { autoClose: false }
      })) as string;
    } else if (notice.message !== this._message && this._id !== null) {
      this._message = notice.message;
      await this._commands.execute(UPDATE, {
        id: this._id,
        message: notice.message,
        type: notice.type,
        autoClose: false
      });
    }
  }

  private _commands: JupyterFrontEnd['commands'];
  private _source: CullSource;
  private _id: string | null = null;
  private _key: string | null = null;
  private _message: string | null = null;
}
