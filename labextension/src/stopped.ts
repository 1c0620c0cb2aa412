/** What the user reads once the server they stopped from the sidebar is going away. */
import { Notification } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';

import { GpuStatusModel, STOPPING } from './model';

/** The hub's home page (start a server again from there). */
export function hubHome(): string {
  const home = PageConfig.getOption('hubPrefix') || '/hub/';
  return home.endsWith('/') ? `${home}home` : `${home}/home`;
}

const announced = new WeakSet<GpuStatusModel>();
/** The notification shown when the stop was asked, updated once the server is going. */
const requested = new WeakMap<GpuStatusModel, string>();

/**
 * Say that the hub is asked to stop this server, and resolve once the toast is on the page
 * (at most `waitMs`). JupyterLab loads its toasts' code on the first notification, from this
 * very server: a first toast emitted once the server has gone never shows, so the stop
 * request waits until this one is drawn (react-toastify's `.Toastify__toast`).
 */
export async function announceStopRequested(model: GpuStatusModel, waitMs = 2000): Promise<void> {
  requested.set(
    model,
    Notification.emit('Asking the hub to stop this server…', 'in-progress', { autoClose: false })
  );
  const drawn = () => document.querySelector('.Toastify__toast') !== null;
  if (drawn()) {
    return;
  }
  await new Promise<void>(resolve => {
    const observer = new MutationObserver(() => {
      if (drawn()) {
        done();
      }
    });
    // The one timer of src/: a bound, so a lab that never draws toasts still sends the stop.
    const bound = window.setTimeout(() => done(), waitMs);
    function done() {
      observer.disconnect();
      window.clearTimeout(bound);
      resolve();
    }
    observer.observe(document.body, { childList: true, subtree: true });
  });
}

/** The stop request failed: the notification says so instead. */
export function announceStopFailed(model: GpuStatusModel, text: string): void {
  const id = requested.get(model);
  requested.delete(model);
  if (id) {
    Notification.update({ id, message: text, type: 'error', autoClose: 10000 });
  } else {
    Notification.error(text, { autoClose: 10000 });
  }
}

/**
 * Say, once, that the server is stopping and its GPU is being released,
 * wherever the user is, with a way to the hub. A notification rather than a
 * dialog: the lab's own "server no longer running" dialogs may already be open.
 */
export function announceStopped(model: GpuStatusModel): void {
  if (announced.has(model)) {
    return;
  }
  announced.add(model);
  const options = {
    autoClose: false as const,
    actions: [
      {
        label: 'Go to the hub',
        caption: 'Start a server again from the hub home page',
        displayType: 'accent' as const,
        callback: () => {
          window.location.href = hubHome();
        }
      }
    ]
  };
  const id = requested.get(model);
  if (id) {
    Notification.update({ id, message: STOPPING, type: 'info', ...options });
  } else {
    Notification.info(STOPPING, options);
  }
}
