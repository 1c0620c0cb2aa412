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
  Notification.info(STOPPING, {
    autoClose: false,
    actions: [
      {
        label: 'Go to the hub',
        caption: 'Start a server again from the hub home page',
        displayType: 'accent',
        callback: () => {
          window.location.href = hubHome();
        }
      }
    ]
  });
}
