import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';
import { LabIcon } from '@jupyterlab/ui-components';

import { parseSettings, statusItemVisible, TRANSLATION_DOMAIN } from './model';
import { CullNotifier, MoveNotifier } from './notify';
import { GpuPanel } from './panel';
import { GpuDataSource } from './source';
import { GpuStatusItem } from './status';
import { JobsRefresher } from './jobs_refresh';

const gpuIcon = new LabIcon({
  name: 'gpuspawner:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161"><path d="M7 5h10a2 2 0 0 1 2 2v10a2 2 0 0 1-2 2H7a2 2 0 0 1-2-2V7a2 2 0 0 1 2-2zm1 3v8h8V8z"/>' +
    '<path d="M8 1h2v3H8zm6 0h2v3h-2zM8 20h2v3H8zm6 0h2v3h-2zM1 8h3v2H1zm0 6h3v2H1zm19-6h3v2h-3zm0 6h3v2h-3z"/></g></svg>'
});

export const COMMAND_OPEN = 'gpuspawner:open-gpu-panel';
/** the plugin id; its settings schema is schema/plugin.json */
export const PLUGIN_ID = 'gpuspawner-labextension:plugin';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU status bar item and side panel of gpuspawner sessions',
  autoStart: true,
  // ITranslator optional: without it (a JupyterLab without the translation plugin) the strings
  // are shown as written, through nullTranslator
  optional: [IStatusBar, ILayoutRestorer, ISettingRegistry, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    restorer: ILayoutRestorer | null,
    settingRegistry: ISettingRegistry | null,
    translator: ITranslator | null
  ) => {
    const trans = (translator ?? nullTranslator).load(TRANSLATION_DOMAIN);
    const source = new GpuDataSource(app.serviceManager.serverSettings, trans);
    if (settingRegistry) {
      // poll intervals, GPU selection and units; changes apply at once (no reload)
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = () => source.configure(parseSettings(settings.composite));
          settings.changed.connect(apply);
          apply();
        })
        .catch(reason => {
          console.error('gpuspawner-labextension: cannot load the settings', reason);
        });
    }
    const panel = new GpuPanel(source, trans);
    panel.title.icon = gpuIcon;
    app.shell.add(panel, 'right', { rank: 900 });
    if (restorer) {
      restorer.add(panel, panel.id);
    }

    // kernel id -> notebook path, for the process table
    const sessions = app.serviceManager.sessions;
    const updateKernelNames = () => {
      const names: Record<string, string> = {};
      for (const s of sessions.running()) {
        if (s.kernel) {
          names[s.kernel.id] = s.path || s.name;
        }
      }
      panel.kernelNames = names;
    };
    sessions.runningChanged.connect(updateKernelNames);
    updateKernelNames();

    app.commands.addCommand(COMMAND_OPEN, {
      label: trans.__('Show GPU panel'),
      describedBy: { args: { type: 'object', properties: {} } },
      execute: () => app.shell.activateById(panel.id)
    });

    if (statusBar) {
      const item = new GpuStatusItem(
        source,
        () => {
          void app.commands.execute(COMMAND_OPEN);
        },
        trans
      );
      statusBar.registerStatusItem('gpuspawner-labextension:status', {
        item,
        align: 'left',
        rank: 50,
        // hidden in a session without a GPU when the showWithoutGpu setting is off; a hidden
        // item stays attached, so the data (and the culler's warnings) keep coming
        isActive: () => statusItemVisible(source.gpus, source.error, source.settings),
        activeStateChanged: source.changed
      });
    }
    new CullNotifier(app.commands, source, trans);
    new MoveNotifier(app.commands, source, undefined, trans);
    // jupyter-scheduler's Notebook Jobs list follows the hub's jobs (src/jobs_refresh.ts)
    new JobsRefresher(document).start();
    console.log('gpuspawner-labextension is activated');
  }
};

export default plugin;
