/**
 * The GPU idle culler, wherever the user is in JupyterLab:
 *
 * - {@link IdleModel}: polls this session's idle state (a Lumino `Poll`,
 *   slower when the tab is hidden) and signals every change;
 * - the notification plugin: a toast with the reclaim time, a countdown
 *   refreshed by the poll and a "Keep my GPU" action, plus a status bar item;
 * - the connection-lost plugin: when the server goes away after its grace
 *   ended, the user reads "your GPU was reclaimed at HH:MM after N minutes at
 *   0 % — start again" instead of JupyterLab's raw connection error.
 */
import { ConnectionLost, IConnectionLost, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { api } from './api';
import { GPULabAPIError } from './handler';
import { idleNotice, idleStatusText, reclaimedMessage, reclaimFromWarning } from './idleLogic';
import { IIdleState, ISession } from './types';

/** This session's idle state, refreshed by a poll; `changed` fires after every refresh. */
export class IdleModel {
  constructor() {
    this._poll = new Poll({
      factory: () => this._refresh(),
      frequency: { interval: 15 * 1000, backoff: true, max: 5 * 60 * 1000 },
      name: 'gpulab:idle',
      standby: 'when-hidden'
    });
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get state(): IIdleState | null {
    return this._state;
  }

  /** Ask now (after "Keep my GPU", or when the connection drops). */
  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  async keep(): Promise<void> {
    const s = this._session;
    if (!s) {
      return;
    }
    try {
      this._state = await api.keepAlive(s.user, s.server_name);
      this._changed.emit();
      const until = this._state.keepalive.until;
      Notification.success(until ? `Your GPU is kept until ${new Date(until).toLocaleTimeString()}.` : 'Kept.', {
        autoClose: 5000
      });
    } catch (e) {
      Notification.error(e instanceof Error ? e.message : String(e), { autoClose: 10000 });
    }
  }

  private async _refresh(): Promise<void> {
    if (!this._session) {
      const s = await api.session();
      if (!s.gpu) {
        return; // a server without a GPU: the culler leaves it alone, nothing to tell
      }
      this._session = s;
    }
    try {
      this._state = await api.idle(this._session.user, this._session.server_name);
    } catch (e) {
      if (e instanceof GPULabAPIError && e.status === 404) {
        return; // a hub without the idle API: nothing to warn about
      }
      throw e; // the Poll backs off; the last state is kept for the connection-lost message
    }
    this._changed.emit();
  }

  private _poll: Poll;
  private _session: ISession | null = null;
  private _state: IIdleState | null = null;
  private _changed = new Signal<this, void>(this);
}

let model: IdleModel | null = null;

/** One model for both plugins (created when the first of them activates). */
function idleModel(): IdleModel {
  if (!model) {
    model = new IdleModel();
  }
  return model;
}

/** The status bar item's widget: text only, hidden when there is no warning. */
class IdleStatus extends Widget {
  constructor(private readonly idle: IdleModel) {
    super();
    this.addClass('gpulab-idle-status');
    this.node.title = 'The GPU idle culler will reclaim this GPU unless it is used or kept';
    idle.changed.connect(this.update, this);
  }

  protected onUpdateRequest(): void {
    this.node.textContent = idleStatusText(this.idle.state, Date.now());
  }
}

const notifications: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-labextension:idle-notifications',
  description: 'Idle GPU warnings as notifications with a countdown and "Keep my GPU", and a status bar item.',
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    const idle = idleModel();
    let toast: string | null = null;
    idle.changed.connect(() => {
      const notice = idleNotice(idle.state, Date.now());
      if (!notice) {
        if (toast) {
          Notification.dismiss(toast);
          toast = null;
        }
        return;
      }
      const options = {
        autoClose: false as const,
        actions: notice.held
          ? []
          : [
              {
                label: 'Keep my GPU',
                caption: 'Protect this GPU from the idle culler for a while',
                displayType: 'accent' as const,
                callback: (event: MouseEvent) => {
                  event.preventDefault(); // keep the toast until the hub answers
                  void idle.keep();
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
      const item = new IdleStatus(idle);
      statusBar.registerStatusItem('gpulab:idle-status', {
        item,
        align: 'left',
        rank: 5,
        isActive: () => idleStatusText(idle.state, Date.now()) !== '',
        activeStateChanged: idle.changed
      });
    }
  }
};

const connectionLost: JupyterFrontEndPlugin<IConnectionLost> = {
  id: 'gpulab-labextension:connection-lost',
  description: 'Says "your GPU was reclaimed ... start again" when the idle culler stopped this server.',
  autoStart: true,
  provides: IConnectionLost,
  activate: (app: JupyterFrontEnd): IConnectionLost => {
    const idle = idleModel();
    let shown = false;
    return async (manager, err, translator) => {
      const info = reclaimFromWarning(idle.state, Date.now());
      if (!info) {
        return ConnectionLost(manager, err, translator);
      }
      if (shown) {
        return;
      }
      shown = true;
      const home = PageConfig.getOption('hubPrefix') || '/hub/';
      const result = await showDialog({
        title: 'Your GPU was reclaimed',
        body: reclaimedMessage(info),
        buttons: [Dialog.cancelButton({ label: 'Close' }), Dialog.okButton({ label: 'Start again' })]
      });
      if (result.button.accept) {
        window.location.href = home.endsWith('/') ? `${home}home` : `${home}/home`;
      }
    };
  }
};

export default [notifications, connectionLost];
