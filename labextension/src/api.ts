import { requestAPI } from './handler';
import {
  IIdleState,
  IJob,
  IJobRequest,
  ILogChunk,
  IMe,
  ISession,
  IStopState,
  ISweep,
  ISweepRequest,
  RerunNotebook
} from './types';

/** Typed calls of the server extension and of the hub API behind it. */
export const api = {
  session: () => requestAPI<ISession>('session'),
  me: () => requestAPI<IMe>('hub/me'),
  idle: (user: string, server: string) =>
    requestAPI<IIdleState>(
      `hub/idle?user=${encodeURIComponent(user)}&server=${encodeURIComponent(server)}`
    ),
  keepAlive: (user: string, server: string) =>
    requestAPI<IIdleState>('hub/idle/keepalive', {
      method: 'POST',
      body: JSON.stringify({ user, server })
    }),
  jobs: async (): Promise<IJob[]> => {
    const data = await requestAPI<IJob[] | { jobs: IJob[] }>('hub/jobs');
    return Array.isArray(data) ? data : data.jobs;
  },
  job: (id: string | number) => requestAPI<IJob>(`hub/jobs/${encodeURIComponent(String(id))}`),
  submit: (request: IJobRequest) =>
    requestAPI<IJob>('hub/jobs', {
      method: 'POST',
      body: JSON.stringify(request)
    }),
  cancel: (id: string | number) =>
    requestAPI<IJob>(`hub/jobs/${encodeURIComponent(String(id))}/cancel`, {
      method: 'POST',
      body: '{}'
    }),
  /** Submit a job again: its notebook as it ran (``kept``) or as it is now (``current``). */
  rerun: (id: string | number, notebook: RerunNotebook = 'kept') =>
    requestAPI<IJob>(`hub/jobs/${encodeURIComponent(String(id))}/rerun`, {
      method: 'POST',
      body: JSON.stringify({ notebook })
    }),
  logs: (id: string | number, offset: number) =>
    requestAPI<ILogChunk>(`hub/jobs/${encodeURIComponent(String(id))}/logs?offset=${offset}`),
  /** Ask the hub to stop this server (and so release its GPU); answered before the server goes. */
  stopServer: () => requestAPI<IStopState>('stop', { method: 'POST', body: '{}' }),
  /** The last stop request of this server, or null. */
  stopState: () => requestAPI<IStopState | null>('stop'),
  /** The user's sweeps, newest first, without their runs. */
  sweeps: async (): Promise<ISweep[]> =>
    (await requestAPI<{ sweeps: ISweep[] }>('hub/sweeps')).sweeps,
  /** One sweep with every run: parameters, state, metrics, the best run. */
  sweep: (id: number) => requestAPI<ISweep>(`hub/sweeps/${encodeURIComponent(String(id))}`),
  submitSweep: (request: ISweepRequest) =>
    requestAPI<ISweep>('hub/sweeps', { method: 'POST', body: JSON.stringify(request) }),
  cancelSweep: (id: number) =>
    requestAPI<ISweep>(`hub/sweeps/${encodeURIComponent(String(id))}/cancel`, {
      method: 'POST',
      body: '{}'
    }),
  output: (id: string | number) =>
    requestAPI<Record<string, unknown>>(`hub/jobs/${encodeURIComponent(String(id))}/output`)
};
