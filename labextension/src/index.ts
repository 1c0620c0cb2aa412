/**
 * gpulab for JupyterLab. One plugin per feature:
 *
 * - `gpulab-labextension:status`: the one status model all views share
 *   ({@link IGpuStatus}: one Lumino poll for session, quota, idle state, jobs);
 * - `gpulab-labextension:sidebar`: the left "GPU" panel (session, idle policy,
 *   "Stop server and release GPU", quota, idle warning, jobs, sweeps as tables)
 *   and the job log / output commands;
 * - `gpulab-labextension:run-as-job`: the "Run as GPU job" command and dialog
 *   (it remembers the last team and profile in the browser's local storage);
 * - `gpulab-labextension:launcher`: a Launcher card in a "GPU" category;
 * - `gpulab-labextension:notebook-toolbar`: a notebook toolbar button;
 * - `gpulab-labextension:filebrowser`: the file browser context menu on .ipynb;
 * - `gpulab-labextension:palette`: gpulab's commands in the command palette
 *   (run as job, open the GPU panel, stop server and release GPU, keep my GPU);
 * - `gpulab-labextension:budget` (budget.tsx): the GPU-hour budgets of the user's teams as a
 *   sidebar section and a notification at 80 % and 100 %;
 * - `gpulab-labextension:idle-notifications` and `:connection-lost` (idle.ts):
 *   idle warnings wherever the user is, and the reclaim explained.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, Notification, ToolbarButton } from '@jupyterlab/apputils';
import { PathExt } from '@jupyterlab/coreutils';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { ILauncher } from '@jupyterlab/launcher';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

import { api } from './api';
import { initialForm, rememberJobChoice, rememberedJobChoice, runJobDialog } from './dialog';
import { gpuIcon } from './icons';
import idlePlugins, { keep } from './idle';
import { keepAliveState, notebookParameters } from './logic';
import { IJobActions } from './jobs';
import { JobLogWidget } from './logs';
import { GpuStatusModel } from './model';
import { SweepTab } from './sweeps';
import { SweepsModel } from './sweepsModel';
import { confirmStop, GPUPanel, releasedWords } from './panel';
import { announceStopped } from './stopped';
import budget from './budget';
import { IGpuSidebar, IGpuStatus } from './tokens';
import { IJob, ISweep } from './types';

namespace CommandIDs {
  export const runAsJob = 'gpulab:run-as-job';
  export const openPanel = 'gpulab:open-panel';
  export const refreshJobs = 'gpulab:refresh-jobs';
  export const stopServer = 'gpulab:stop-server';
  export const keepGpu = 'gpulab:keep-gpu';
}

const OUTPUT_DIR = 'gpulab-outputs';

async function openOutput(app: JupyterFrontEnd, job: IJob): Promise<void> {
  const contents = app.serviceManager.contents;
  if (job.output_path) {
    try {
      await contents.get(job.output_path, { content: false });
      await app.commands.execute('docmanager:open', { path: job.output_path });
      return;
    } catch {
      // not inside this server's root: fetch it through the API below
    }
  }
  const nb = await api.output(job.id);
  try {
    await contents.get(OUTPUT_DIR, { content: false });
  } catch {
    const dir = await contents.newUntitled({ type: 'directory', path: '' });
    await contents.rename(dir.path, OUTPUT_DIR);
  }
  const base = PathExt.basename(job.notebook, '.ipynb');
  const path = `${OUTPUT_DIR}/${base}-job-${String(job.id)}.ipynb`;
  await contents.save(path, { type: 'notebook', format: 'json', content: nb });
  await app.commands.execute('docmanager:open', { path });
}

function openJobLog(app: JupyterFrontEnd, job: IJob): void {
  const content = new JobLogWidget(job);
  const widget = new MainAreaWidget({ content });
  widget.id = `gpulab-logs-${String(job.id)}`;
  widget.title.label = `Log: ${job.name || PathExt.basename(job.notebook)} #${String(job.id)}`;
  widget.title.icon = gpuIcon;
  widget.title.closable = true;
  app.shell.add(widget, 'main');
}

/** A sweep's table in a tab of the main area (activated when it is open already). */
function openSweepTab(app: JupyterFrontEnd, sweep: ISweep, actions: IJobActions): void {
  const id = `gpulab-sweep-${String(sweep.id)}`;
  if (document.getElementById(id)) {
    app.shell.activateById(id);
    return;
  }
  const model = new SweepsModel({ client: api });
  void model.select(sweep.id);
  const widget = new MainAreaWidget({ content: new SweepTab(model, actions) });
  widget.id = id;
  widget.title.label = `Sweep: ${sweep.name} #${String(sweep.id)}`;
  widget.title.icon = gpuIcon;
  widget.title.closable = true;
  app.shell.add(widget, 'main');
  app.shell.activateById(id);
}

const status: JupyterFrontEndPlugin<GpuStatusModel> = {
  id: 'gpulab-labextension:status',
  description:
    'The GPU status model every gpulab view subscribes to (one poll, standby when hidden, back-off on errors).',
  autoStart: true,
  provides: IGpuStatus,
  activate: () => new GpuStatusModel({ client: api })
};

const sidebar: JupyterFrontEndPlugin<IGpuSidebar> = {
  id: 'gpulab-labextension:sidebar',
  description:
    'The GPU sidebar: session GPU, idle policy, stop button, team quota, idle warning and jobs.',
  autoStart: true,
  requires: [IGpuStatus],
  provides: IGpuSidebar,
  activate: (app: JupyterFrontEnd, model: GpuStatusModel): IGpuSidebar => {
    const sweeps = new SweepsModel({ client: api });
    const jobActions = {
      openLogs: (job: IJob) => openJobLog(app, job),
      openOutput: (job: IJob) => openOutput(app, job)
    };
    const panel = new GPUPanel(
      model,
      {
        ...jobActions,
        runAsJob: () => void app.commands.execute(CommandIDs.runAsJob, {}),
        openSweep: (sweep: ISweep) => openSweepTab(app, sweep, jobActions)
      },
      sweeps
    );
    app.shell.add(panel, 'left', { rank: 650 });
    model.stopChanged.connect((_, stop) => {
      if (stop?.state === 'stopping') {
        void announceStopped(model);
      }
    });
    app.commands.addCommand(CommandIDs.openPanel, {
      label: 'Show the GPU panel',
      execute: () => app.shell.activateById(panel.id)
    });
    app.commands.addCommand(CommandIDs.refreshJobs, {
      label: 'Refresh GPU jobs and sweeps',
      execute: () => Promise.all([model.refresh(), sweeps.refresh()])
    });
    return panel;
  }
};

const runAsJob: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-labextension:run-as-job',
  description: 'The "Run as GPU job" command and dialog.',
  autoStart: true,
  optional: [INotebookTracker, IDefaultFileBrowser],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker | null,
    browser: IDefaultFileBrowser | null
  ) => {
    const pickNotebook = (args: Record<string, unknown>): string => {
      if (typeof args.path === 'string' && args.path) {
        return args.path;
      }
      const current = tracker?.currentWidget;
      if (current && app.shell.currentWidget === current) {
        return current.context.path;
      }
      const selected = browser?.selectedItems().next();
      if (
        selected &&
        !selected.done &&
        (selected.value.path.endsWith('.ipynb') || selected.value.path.endsWith('.py'))
      ) {
        return selected.value.path;
      }
      return current?.context.path ?? '';
    };
    app.commands.addCommand(CommandIDs.runAsJob, {
      label: args => (args.isLauncher ? 'GPU job' : 'Run as GPU job…'),
      caption: 'Run a notebook or a Python script as a batch or training job on GPUs',
      icon: gpuIcon,
      execute: async args => {
        const path = pickNotebook(args);
        // The job runs the saved file: save an open notebook with unsaved changes first.
        let parameters: Record<string, unknown> = {};
        const open = tracker?.find(w => w.context.path === path);
        if (open && open.context.model.dirty) {
          await open.context.save();
        }
        const [me, session] = await Promise.all([api.me(), api.session().catch(() => null)]);
        if (path.endsWith('.ipynb')) {
          try {
            const model = await app.serviceManager.contents.get(path, { content: true });
            parameters = notebookParameters((model.content?.cells ?? []) as []);
          } catch {
            // unreadable notebook: the form still opens and the API will say what is wrong
          }
        }
        const job = await runJobDialog(
          me,
          initialForm(me, path, parameters, session, rememberedJobChoice(me.user))
        );
        if (job) {
          rememberJobChoice(me.user, { team: job.team, profile: job.profile });
          if (app.commands.hasCommand(CommandIDs.refreshJobs)) {
            await app.commands.execute(CommandIDs.refreshJobs);
            await app.commands.execute(CommandIDs.openPanel);
          }
        }
        return job;
      }
    });
  }
};

const launcher: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-labextension:launcher',
  description: 'A Launcher card "GPU job" in a "GPU" category.',
  autoStart: true,
  requires: [ILauncher],
  activate: (app: JupyterFrontEnd, launcher: ILauncher) => {
    launcher.add({
      command: CommandIDs.runAsJob,
      category: 'GPU',
      rank: 0,
      args: { isLauncher: true }
    });
  }
};

const notebookToolbar: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-labextension:notebook-toolbar',
  description: 'A "Run as GPU job" button in the notebook toolbar.',
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (panel: NotebookPanel) => {
        const button = new ToolbarButton({
          icon: gpuIcon,
          label: 'GPU job',
          tooltip: 'Run this notebook as a GPU job',
          className: 'gpulab-toolbar-button',
          onClick: () =>
            void app.commands.execute(CommandIDs.runAsJob, { path: panel.context.path })
        });
        panel.toolbar.insertItem(10, 'gpulab-run-as-job', button);
        return button;
      }
    });
  }
};

const fileBrowserMenu: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-labextension:filebrowser',
  description: 'File browser context menu entry "Run as GPU job" on notebooks and Python scripts.',
  autoStart: true,
  requires: [IDefaultFileBrowser],
  activate: (app: JupyterFrontEnd, browser: IDefaultFileBrowser) => {
    const id = 'gpulab:run-selected-as-job';
    app.commands.addCommand(id, {
      label: 'Run as GPU job…',
      icon: gpuIcon,
      execute: () => {
        const item = browser.selectedItems().next();
        const path = item && !item.done ? item.value.path : '';
        return app.commands.execute(CommandIDs.runAsJob, { path });
      }
    });
    for (const type of ['notebook', 'python']) {
      app.contextMenu.addItem({
        command: id,
        selector: `.jp-DirListing-item[data-file-type="${type}"]`,
        rank: 3
      });
    }
  }
};

const palette: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-labextension:palette',
  description:
    'gpulab in the command palette: run as GPU job, show the GPU panel, stop server and release GPU, keep my GPU.',
  autoStart: true,
  requires: [IGpuStatus],
  optional: [ICommandPalette],
  activate: (app: JupyterFrontEnd, model: GpuStatusModel, palette: ICommandPalette | null) => {
    app.commands.addCommand(CommandIDs.stopServer, {
      label: () => (model.session?.gpu ? 'Stop server and release GPU' : 'Stop server'),
      caption: 'Ask the hub to stop this JupyterLab server (after a confirmation)',
      isEnabled: () =>
        model.session !== null && !['requested', 'stopping'].includes(model.stop?.state ?? ''),
      execute: () =>
        confirmStop(model, releasedWords(model.session), text =>
          Notification.error(text, { autoClose: 10000 })
        )
    });
    app.commands.addCommand(CommandIDs.keepGpu, {
      label: 'Keep my GPU',
      caption: 'Ask the idle culler for more time before it reclaims this GPU',
      isEnabled: () => !!model.session?.gpu && !!model.idle && keepAliveState(model.idle).enabled,
      execute: () => keep(model)
    });
    const changed = () => {
      app.commands.notifyCommandChanged(CommandIDs.stopServer);
      app.commands.notifyCommandChanged(CommandIDs.keepGpu);
    };
    model.sessionChanged.connect(changed);
    model.idleChanged.connect(changed);
    model.stopChanged.connect(changed);
    if (palette) {
      const category = 'GPU';
      for (const command of [
        CommandIDs.runAsJob,
        CommandIDs.openPanel,
        CommandIDs.stopServer,
        CommandIDs.keepGpu
      ]) {
        palette.addItem({ command, category });
      }
    }
  }
};

export default [
  status,
  palette,
  sidebar,
  budget,
  runAsJob,
  launcher,
  notebookToolbar,
  fileBrowserMenu,
  ...idlePlugins
];
