/** The side panel: per-GPU charts, processes, allocation warnings and the culler's warning. */
import { Widget } from '@lumino/widgets';

import { h, svg } from './dom';
import {
  budgetLine,
  cullWarning,
  formatMemory,
  formatPercent,
  gpuRows,
  historySeries,
  processRows,
  sessionWithoutGpu,
  sparklinePath,
  stateText,
  Trans,
  untranslated
} from './model';
import { GpuDataSource } from './source';

const CHART_W = 240;
const CHART_H = 40;
/** points shown in a chart: the server keeps "the last minutes" of history */
const CHART_CAPACITY = 90;

function sparkline(
  label: string,
  values: (number | null)[],
  max: number,
  current: string,
  cls: string,
  trans: Trans
): HTMLElement {
  const chart = svg('svg', {
    class: `jp-gpuspawner-spark ${cls}`,
    viewBox: `0 0 ${CHART_W} ${CHART_H}`,
    preserveAspectRatio: 'none',
    role: 'img',
    'aria-label': trans.__('%1 history', label)
  });
  chart.append(
    svg('rect', {
      x: '0',
      y: '0',
      width: `${CHART_W}`,
      height: `${CHART_H}`,
      class: 'jp-gpuspawner-spark-bg'
    })
  );
  const d = sparklinePath(values, CHART_W, CHART_H, max, CHART_CAPACITY);
  if (d) {
    chart.append(
      svg('path', { d, class: 'jp-gpuspawner-spark-line', 'vector-effect': 'non-scaling-stroke' })
    );
  }
  return h(
    'div',
    { class: 'jp-gpuspawner-chart' },
    h(
      'div',
      { class: 'jp-gpuspawner-chart-label' },
      h('span', {}, label),
      h('span', { class: 'jp-gpuspawner-value' }, current)
    ),
    chart
  );
}

export class GpuPanel extends Widget {
  /** `trans`: the extension's translation bundle (JupyterLab's ITranslator, domain gpuspawner) */
  constructor(source: GpuDataSource, trans: Trans = untranslated) {
    super();
    this._trans = trans;
    this.id = 'gpuspawner-gpu-panel';
    this.addClass('jp-gpuspawner-panel');
    this.title.caption = trans.__('GPUs of this session');
    this._source = source;
    this._source.changed.connect(this.render, this);
    this.render();
  }

  /** kernel id -> label (the notebook path); set by the plugin from the session manager */
  kernelNames: Record<string, string> = {};

  protected onAfterShow(): void {
    this._source.setVisible('panel', true);
    this.render();
  }

  protected onAfterHide(): void {
    this._source.setVisible('panel', false);
  }

  dispose(): void {
    this._source.setVisible('panel', false);
    this._source.changed.disconnect(this.render, this);
    super.dispose();
  }

  render(): void {
    const src = this._source;
    const trans = this._trans;
    const body: HTMLElement[] = [
      h('h2', { class: 'jp-gpuspawner-title' }, trans.__('GPUs of this session'))
    ];
    const gpus = src.gpus;
    const metrics = src.metrics;

    if (src.error !== null) {
      body.push(
        h(
          'div',
          { class: 'jp-gpuspawner-state jp-gpuspawner-state-error', 'data-state': 'unreachable' },
          h('strong', {}, trans.__('GPU data unavailable')),
          h('p', {}, src.error)
        )
      );
    } else if (gpus === null) {
      body.push(
        h(
          'div',
          { class: 'jp-gpuspawner-state', 'data-state': 'loading' },
          trans.__('Loading GPU data…')
        )
      );
    }

    if (gpus !== null) {
      const cull = cullWarning(gpus.culler, Date.now(), trans);
      if (cull) {
        body.push(h('div', { class: 'jp-gpuspawner-cull', role: 'alert' }, cull));
      }
      if (sessionWithoutGpu(gpus) && src.error === null) {
        body.push(
          h(
            'div',
            { class: 'jp-gpuspawner-state jp-gpuspawner-state-no_gpu', 'data-state': 'no_gpu' },
            h('strong', {}, trans.__('no GPU')),
            h('p', {}, trans.__('This session was started without a GPU.'))
          )
        );
      } else if (gpus.state !== 'ok' && src.error === null) {
        body.push(
          h(
            'div',
            {
              class: `jp-gpuspawner-state jp-gpuspawner-state-${gpus.state}`,
              'data-state': gpus.state
            },
            h('strong', {}, stateText(gpus.state, trans)),
            gpus.message ? h('p', {}, gpus.message) : null
          )
        );
      }
      if (gpus.share) {
        body.push(
          h(
            'p',
            {
              class: 'jp-gpuspawner-share',
              'data-mechanism': gpus.share.mechanism
            },
            h('strong', {}, trans.__('Your GPU share: ')),
            gpus.share.text
          )
        );
      }
      if (gpus.usage) {
        const u = gpus.usage;
        body.push(
          h(
            'div',
            { class: 'jp-gpuspawner-usage', 'data-testid': 'own-usage' },
            h(
              'p',
              {},
              trans.__(
                'This month: %1 GPU-hours, %2 core-hours',
                u.gpu_hours.toFixed(1),
                u.core_hours.toFixed(1)
              )
            ),
            ...u.budgets.map(b =>
              h(
                'p',
                {
                  class:
                    b.warning || b.exceeded
                      ? 'jp-gpuspawner-budget jp-gpuspawner-budget-warn'
                      : 'jp-gpuspawner-budget'
                },
                budgetLine(b, trans)
              )
            )
          )
        );
      }
      if (gpus.warnings.length) {
        body.push(
          h('ul', { class: 'jp-gpuspawner-warnings' }, ...gpus.warnings.map(w => h('li', {}, w)))
        );
      }
      const settings = src.settings;
      const rows = gpuRows(gpus, metrics, settings.gpus);
      for (const row of rows) {
        const s = row.sample;
        const facts = [
          row.info.pci_bus_id ? `PCI ${row.info.pci_bus_id}` : null,
          row.info.numa_node !== null ? `NUMA ${row.info.numa_node}` : null,
          row.info.mig ? 'MIG' : null,
          row.info.in_allocation ? trans.__('allocated') : null
        ]
          .filter(Boolean)
          .join(' · ');
        const util = historySeries(metrics, row.info.uuid, 'utilization_percent');
        const mem = historySeries(metrics, row.info.uuid, 'memory_used_bytes');
        const utilText =
          row.info.mig && (s?.utilization_percent ?? null) === null
            ? trans.__('n/a (MIG)')
            : formatPercent(s?.utilization_percent ?? null);
        body.push(
          h(
            'section',
            { class: 'jp-gpuspawner-gpu', 'data-uuid': row.info.uuid },
            h(
              'div',
              { class: 'jp-gpuspawner-gpu-name' },
              `#${row.info.index ?? '?'} ${row.info.name}`
            ),
            h(
              'div',
              { class: 'jp-gpuspawner-gpu-facts', title: row.info.uuid },
              facts || row.info.uuid
            ),
            sparkline(
              trans.__('Utilisation'),
              util,
              100,
              utilText,
              'jp-gpuspawner-spark-util',
              trans
            ),
            sparkline(
              trans.__('Memory'),
              mem,
              row.memoryTotal ?? 1,
              formatMemory(s?.memory_used_bytes ?? null, row.memoryTotal, settings.units),
              'jp-gpuspawner-spark-mem',
              trans
            ),
            h(
              'div',
              { class: 'jp-gpuspawner-gpu-facts' },
              trans.__(
                'Temperature %1 °C · Power %2 W',
                s?.temperature_c ?? '–',
                s?.power_w !== null && s?.power_w !== undefined ? s.power_w.toFixed(0) : '–'
              )
            )
          )
        );
      }
      if (gpus.state === 'ok' && rows.length === 0) {
        body.push(
          settings.gpus.length > 0 && gpus.gpus.length > 0
            ? h(
                'div',
                { class: 'jp-gpuspawner-state', 'data-state': 'none_selected' },
                trans.__(
                  'None of the GPUs in the settings (%1) is in this session.',
                  settings.gpus.join(', ')
                )
              )
            : h(
                'div',
                { class: 'jp-gpuspawner-state', 'data-state': 'no_gpu' },
                trans.__('No GPU in this session.')
              )
        );
      }
      const procs = processRows(gpus, metrics, this.kernelNames, settings);
      if (gpus.state === 'ok') {
        body.push(h('h3', {}, trans.__('Processes')));
        body.push(
          procs.length
            ? h(
                'table',
                { class: 'jp-gpuspawner-procs' },
                h(
                  'thead',
                  {},
                  h(
                    'tr',
                    {},
                    h('th', {}, trans.__('GPU')),
                    h('th', {}, trans.__('PID')),
                    h('th', {}, trans.__('Memory')),
                    h('th', {}, trans.__('Kernel'))
                  )
                ),
                h(
                  'tbody',
                  {},
                  ...procs.map(p =>
                    h(
                      'tr',
                      {},
                      h('td', {}, p.gpu),
                      h('td', {}, `${p.pid}`),
                      h('td', {}, p.memory),
                      h('td', {}, p.kernel)
                    )
                  )
                )
              )
            : h('p', { class: 'jp-gpuspawner-muted' }, trans.__('No process uses these GPUs.'))
        );
      }
    }
    if (src.updatedAt !== null) {
      body.push(
        h(
          'p',
          { class: 'jp-gpuspawner-muted' },
          trans.__('Updated %1', new Date(src.updatedAt).toLocaleTimeString())
        )
      );
    }
    this.node.replaceChildren(...body);
  }

  private _source: GpuDataSource;
  private _trans: Trans;
}
