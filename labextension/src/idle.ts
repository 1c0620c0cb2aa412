/**
 * The GPU idle culler, wherever the user is in JupyterLab (both plugins read
 * the shared {@link GpuStatusModel}; neither polls on its own):
 *
 * - the notification plugin: a toast with the reclaim time, the time left
 *   refreshed with the model, and a "Keep my GPU" action, plus a status bar item;
 * - the connection-lost plugin: when the server goes away after its grace
 *   ended, the user reads "your GPU was reclaimed at HH:MM after N minutes at
 *   0 % — start again" instead of JupyterLab's raw connection error; when the
 *   user stopped it from the sidebar, "Server stopped, GPU released".
 */
import {
  ConnectionLost,
  IConnectionLost,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import { message } from './errors';
import { idleNotice, idleStatusText, reclaimedMessage, reclaimFromWarning } from './idleLogic';
import { GpuStatusModel } from './model';
import { announceStopped, hubHome } from './stopped';
import { IGpuStatus } from './tokens';

/** "Keep my GPU" from the toast or the command palette: the hub's answer as a notification. */
export async function keep(model: GpuStatusModel): Promise<void> {
  try {
    const state = await model.keep();
    const until = state?.keepalive.until;
    Notification.success(
      until ? `Your GPU is kept until ${new Date(until).toLocaleTimeString()}.` : 'Kept.',
      {
        autoClose: 5000
      }
    );
  } catch (e) {
    Notification.error(message(e), { autoClose: 10000 });
  }
}

/** The status bar item's widget: text only, hidden when there is no warning. */
class IdleStatus extends Widget {
  constructor(private readonly model: GpuStatusModel) {
    super();
    this.addClass('gpulab-idle-status');
    this.node.title = 'The GPU idle culler will reclaim this GPU unless it is used or kept';
    model.changed.connect(this.update, this);
  }

  protected onUpdateRequest(): void {
    this.node.textContent = idleStatusText(this.model.idle, Date.now());
  }
}

const notifications: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-labextension:idle-notifications',
  description:
    'Idle GPU warnings as notifications with a countdown and "Keep my GPU", and a status bar item.',
  autoStart: true,
  requires: [IGpuStatus],
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, model: GpuStatusModel, statusBar: IStatusBar | null) => {
    let toast: string | null = null;
    let shown = '';
    model.changed.connect(() => {
      const notice = idleNotice(model.idle, Date.now());
      if (!notice) {
        if (toast) {
          Notification.dismiss(toast);
          toast = null;
          shown = '';
        }
        return;
      }
      if (toast && notice.message === shown && Notification.manager.has(toast)) {
        return; // nothing new to say (the model changes every few seconds)
      }
      shown = notice.message;
      const options = {
        autoClose: false as const,
        actions:
          notice.held || notice.lifetime
            ? []
            : [
                {
                  label: 'Keep my GPU',
                  caption: 'Protect this GPU from the idle culler for a while',
                  displayType: 'accent' as const,
                  callback: (event: MouseEvent) => {
                    event.preventDefault(); // keep the toast until the hub answers
                    void keep(model);
                  }
                }
              ]
      };
      if (toast && Notification.manager.has(toast)) {
        Notification.update({ id: toast, message: notice.message, type: 'warning', ...options });
      } else {
        toast = Notification.warning(notice.message, options);
      }
    });
    if (statusBar) {
      const item = new IdleStatus(model);
      statusBar.registerStatusItem('gpulab:idle-status', {
        item,
        align: 'left',
        rank: 5,
        isActive: () => idleStatusText(model.idle, Date.now()) !== '',
        activeStateChanged: model.changed
      });
    }
  }
};

const connectionLost: JupyterFrontEndPlugin<IConnectionLost> = {
  id: 'gpulab-labextension:connection-lost',
  description:
    'Says "your GPU was reclaimed ... start again" when the idle culler stopped this server, "server stopped" when the user did.',
  autoStart: true,
  requires: [IGpuStatus],
  provides: IConnectionLost,
  activate: (app: JupyterFrontEnd, model: GpuStatusModel): IConnectionLost => {
    let shown = false;
    return async (manager, err, translator) => {
      if (model.stop?.state === 'requested' || model.stop?.state === 'stopping') {
        return announceStopped(model); // the user stopped it from the sidebar
      }
      const info = reclaimFromWarning(model.idle, model.lostAt ?? Date.now());
      if (!info) {
        return ConnectionLost(manager, err, translator);
      }
      if (shown) {
        return;
      }
      shown = true;
      const result = await showDialog({
        title: 'Your GPU was reclaimed',
        body: reclaimedMessage(info),
        buttons: [
          Dialog.cancelButton({ label: 'Close' }),
          Dialog.okButton({ label: 'Start again' })
        ]
      });
      if (result.button.accept) {
        window.location.href = hubHome();
      }
    };
  }
};

export default [notifications, connectionLost];
