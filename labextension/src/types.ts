/**
 * Shapes of the gpulab APIs (see the shared contracts: /hub/api/gpulab/* and
 * the server extension's /gpulab/api/session).
 */

export interface IDeviceSample {
  id: string;
  uuid: string;
  name: string;
  gpu_percent: number;
  memory_used_mib: number;
  memory_total_mib: number;
}

export type Utilisation =
  { available: true; at: number; devices: IDeviceSample[] } | { available: false; reason: string };

export interface ISession {
  user: string;
  server_name: string;
  gpu: boolean;
  team: string | null;
  profile: string | null;
  gpu_milli: number | null;
  gpu_fraction: string | null;
  gpu_model: string | null;
  gpu_source: string | null;
  memory_mib: number | null;
  quota: string | null;
  preemptible: boolean;
  devices: string[];
  share: string | null;
  hub: boolean;
  utilisation: Utilisation;
}

export interface IProfileChoice {
  slug: string;
  display_name: string;
  description: string;
  gpu_milli: number;
  gpu_model: string;
  priority_class: string;
  available: boolean;
  reason: string;
  over_quota: boolean;
  capacity: string;
  /** The GPU idle culler's timeout for this profile (profile or team setting); null: the culler's default. */
  idle_timeout_seconds?: number | null;
  /** What happens to an idle GPU of this profile, in the hub's one sentence (as the spawn page says it). */
  idle_policy?: string;
  /** One line when the user's own recorded sessions say a smaller profile would have done ('' or absent: none). */
  right_size?: string;
  /** Would a job of each class be admitted with this profile now (a training job never bursts). */
  job_classes?: Record<JobClass, IJobOffer>;
}

export interface IJobOffer {
  available: boolean;
  over_quota: boolean;
  reason: string;
  /** What to do about it, as the spawn page says it ('' when available; absent from older hubs). */
  todo?: string;
}

export interface ITeamView {
  name: string;
  display_name: string;
  guarantee_milli: number;
  burst_milli: number;
  per_user_cap_milli: number | null;
  held_milli: number;
  in_quota_milli: number;
  over_quota_milli: number;
  free_milli: number;
  user_held_milli: number;
  summary: string;
  profiles: IProfileChoice[];
}

export interface IMe {
  user: string;
  teams: ITeamView[];
  holdings: {
    key: string;
    team: string;
    profile: string;
    gpu_milli: number;
    kind: string;
    over_quota: boolean;
    state: string;
  }[];
}

export interface IIdleState {
  user: string;
  server: string;
  /** The running server session (its start time); '' when the server is not running. */
  session?: string;
  warning: null | {
    warned_at: string;
    reclaim_at: string;
    reason: string;
    /** Data went missing after the warning: no reclaim until it returns, then a fresh grace. */
    held?: boolean;
    evidence: Record<string, unknown>;
  };
  /** Set when the culler finds no utilisation for this running session: it is never reclaimed. */
  reclaim_off?: null | {
    code: string;
    reason: string;
    since: string;
  };
  /** Set when the server is not running and its last end was a reclaim. */
  reclaimed?: null | {
    at: string;
    idle_minutes: number | null;
    peak_percent: number;
    message: string;
  };
  keepalive: {
    used: number;
    max: number;
    extends_seconds: number;
    until: string | null;
  };
}

export type JobState =
  'queued' | 'running' | 'preempted' | 'succeeded' | 'failed' | 'cancelled' | 'timed-out';

export type JobClass = 'batch' | 'training';

/** Re-run's choices: the notebook exactly as the job ran it, or as it is now. */
export type RerunNotebook = 'kept' | 'current';

export interface IJob {
  id: string | number;
  name: string;
  user: string;
  team: string;
  profile: string;
  job_class: JobClass;
  state: JobState;
  reason: string | null;
  gpu_milli: number;
  over_quota: boolean;
  /** `notebook` (papermill) or `script` (older hubs: absent, a notebook). */
  kind?: 'notebook' | 'script';
  /** The path of what runs: the notebook, or the script of a script job (also in `script`). */
  notebook: string;
  script?: string | null;
  args?: string[];
  nodes?: number;
  output_path: string | null;
  log_path: string | null;
  /** The notebook as submitted, kept with the job: what it ran and what Re-run runs again. */
  input_path?: string;
  /** The job whose kept notebook this one ran again. */
  rerun_of?: number | null;
  parameters: Record<string, unknown>;
  time_limit_seconds: number;
  created_at: string;
  started_at: string | null;
  finished_at: string | null;
  history: { state: JobState; at: string; reason: string | null }[];
}

export interface IJobRequest {
  /** Exactly one of `notebook` and `script`. */
  notebook?: string;
  script?: string;
  /** A script's arguments, passed as they are. */
  args?: string[];
  nodes?: number;
  job_class: JobClass;
  profile: string;
  team?: string;
  parameters?: Record<string, unknown>;
  time_limit_seconds: number;
  name?: string;
  idempotency_key?: string;
}

export interface ILogChunk {
  text: string;
  offset: number;
  complete: boolean;
}

/** The server extension's record of "Stop server and release GPU" (`/gpulab/api/stop`). */
export interface IStopState {
  /**
   * `requested`: sent to the hub; `failed`: the hub refused; `stopping` (seen
   * by the lab only): the server no longer answers, the hub is stopping it.
   */
  state: 'requested' | 'failed' | 'stopping';
  at: string;
  message: string;
  status?: number;
}
