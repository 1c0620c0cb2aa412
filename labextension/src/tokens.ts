import { Token } from '@lumino/coreutils';

import { GpuStatusModel } from './model';

/** The one status model (session, quota, idle state, jobs) every gpulab view subscribes to. */
export const IGpuStatus = new Token<GpuStatusModel>(
  'gpulab-labextension:IGpuStatus',
  'The GPU status model: this session, the team quota, the idle state and the jobs, polled once for all views.'
);
