/** A scripted stand-in for the server extension, recording when each part is asked. */
import { GPULabAPIError } from '../src/errors';
import { IGpuLabClient } from '../src/model';
import { IIdleState, IJob, IMe, IProfileChoice, ISession, IStopState } from '../src/types';

/** A profile as /hub/api/gpulab/me lists it: available, in quota, unless `extra` says otherwise. */
export function profileChoice(
  slug: string,
  milli: number,
  extra: Partial<IProfileChoice> = {}
): IProfileChoice {
  return {
    slug,
    display_name: slug,
    description: '',
    gpu_milli: milli,
    gpu_model: 'H100-80GB',
    priority_class: 'gpulab-development',
    available: true,
    reason: '',
    over_quota: false,
    capacity: '',
    ...extra
  };
}

export const SESSION: ISession = {
  user: 'alice',
  server_name: '',
  gpu: true,
  team: 'vision',
  profile: 'h100-half',
  gpu_milli: 500,
  gpu_fraction: '0.5',
  gpu_model: 'H100-80GB',
  gpu_source: 'declared',
  memory_mib: null,
  quota: 'in-quota',
  preemptible: false,
  devices: ['0'],
  share: '0.5 × H100-80GB',
  hub: true,
  utilisation: { available: false, reason: 'no driver' }
};

export const ME: IMe = { user: 'alice', teams: [], holdings: [] };

export function job(id: number, state: IJob['state']): IJob {
  return {
    id,
    name: `job${id}`,
    user: 'alice',
    team: 'vision',
    profile: 'h100-quarter',
    job_class: 'batch',
    state,
    reason: null,
    gpu_milli: 250,
    over_quota: false,
    notebook: 'a.ipynb',
    output_path: null,
    log_path: null,
    parameters: {},
    time_limit_seconds: 600,
    created_at: '2026-11-30T10:00:00Z',
    started_at: null,
    finished_at: null,
    history: []
  };
}

export const IDLE: IIdleState = {
  user: 'alice',
  server: '',
  warning: null,
  keepalive: { used: 0, max: 2, extends_seconds: 3600, until: null }
};

export class FakeClient implements IGpuLabClient {
  calls: { part: string; at: number }[] = [];
  jobList: IJob[] = [];
  /** Make a part fail: the error it throws. */
  failing: Partial<Record<'session' | 'me' | 'jobs' | 'idle', Error>> = {};

  count(part: string): number {
    return this.calls.filter(c => c.part === part).length;
  }

  times(part: string): number[] {
    return this.calls.filter(c => c.part === part).map(c => c.at);
  }

  private async answer<T>(part: 'session' | 'me' | 'jobs' | 'idle', value: T): Promise<T> {
    this.calls.push({ part, at: Date.now() });
    const error = this.failing[part];
    if (error) {
      throw error;
    }
    return value;
  }

  session(): Promise<ISession> {
    return this.answer('session', SESSION);
  }
  me(): Promise<IMe> {
    return this.answer('me', ME);
  }
  jobs(): Promise<IJob[]> {
    return this.answer(
      'jobs',
      this.jobList.map(j => ({ ...j }))
    );
  }
  idle(): Promise<IIdleState> {
    return this.answer('idle', IDLE);
  }
  async keepAlive(): Promise<IIdleState> {
    return IDLE;
  }
  async stopServer(): Promise<IStopState> {
    return { state: 'requested', at: new Date().toISOString(), message: 'stopping' };
  }
  async stopState(): Promise<IStopState | null> {
    return null;
  }
}

export const hubDown = () =>
  new GPULabAPIError(502, 'the hub is not reachable: Connection refused');
export const noGpulab = () => new GPULabAPIError(404, 'This hub does not run gpulab', 'no-gpulab');
