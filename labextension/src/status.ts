/** The status bar item: utilisation and memory of the session's GPUs, or the state. */
import { Widget } from '@lumino/widgets';

import { deriveStatus, Trans, untranslated } from './model';
import { GpuDataSource } from './source';

export class GpuStatusItem extends Widget {
  constructor(source: GpuDataSource, onClick: () => void, trans: Trans = untranslated) {
    super({ node: document.createElement('div') });
    this._trans = trans;
    this.id = 'gpuspawner-gpu-status';
    this.addClass('jp-gpuspawner-status');
    this.node.setAttribute('role', 'button');
    this.node.addEventListener('click', onClick);
    this._source = source;
    this._source.changed.connect(this.render, this);
    this.render();
  }

  protected onAfterAttach(): void {
    this._source.setVisible('status', true);
  }

  protected onBeforeDetach(): void {
    this._source.setVisible('status', false);
  }

  render(): void {
    const src = this._source;
    const trans = this._trans;
    const v = deriveStatus(src.gpus, src.metrics, src.error, Date.now(), src.settings, trans);
    this.node.textContent = v.text;
    this.node.title = `${v.title}\n${trans.__('(click for the GPU panel)')}`;
    this.node.dataset.level = v.level;
  }

  private _source: GpuDataSource;
  private _trans: Trans;
}
