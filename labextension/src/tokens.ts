import { Token } from '@lumino/coreutils';
import { ISignal } from '@lumino/signaling';

import { GpuStatusModel } from './model';

/** The one status model (session, quota, idle state, jobs) every gpulab view subscribes to. */
export const IGpuStatus = new Token<GpuStatusModel>(
  'gpulab-labextension:IGpuStatus',
  'The GPU status model: this session, the team quota, the idle state and the jobs, polled once for all views.'
);

/** The GPU sidebar: other plugins add a section of their own below the quota (a budget, a hint). */
export interface IGpuSidebar {
  /** Render `render()` as a section of the panel, again whenever `changed` emits. */
  addSection(id: string, render: () => JSX.Element | null, changed: ISignal<unknown, void>): void;
}

export const IGpuSidebar = new Token<IGpuSidebar>(
  'gpulab-labextension:IGpuSidebar',
  'The GPU sidebar panel, for plugins that add a section of their own to it.'
);
