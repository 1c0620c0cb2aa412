/**
 * The one model behind every gpulab view in JupyterLab: this session's GPU
 * and utilisation, the team quota, the idle state and the user's jobs.
 *
 * One Lumino `Poll` refreshes it: it stands by while the tab is hidden, backs
 * off (up to `maxInterval`) while the server or the hub does not answer, and
 * asks the hub for the slower-moving parts (quota, idle state) only every few
 * ticks, or at once when a job changed state. While one of the user's jobs is
 * queued or running it ticks faster (`activeInterval`) and asks only the jobs
 * on the extra ticks, so a job's change shows within about a second; with
 * nothing running it goes back to its normal pace. Views subscribe to its
 * signals; none of them keeps a timer of its own.
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { Absence, GPULabAPIError, message } from './errors';
import { isTerminal } from './logic';
import { IIdleState, IJob, IMe, ISession, IStopState } from './types';

/** What the model asks of the server extension (the real one is `api` in api.ts). */
export interface IGpuLabClient {
  session(): Promise<ISession>;
  me(): Promise<IMe>;
  jobs(): Promise<IJob[]>;
  idle(user: string, server: string): Promise<IIdleState>;
  keepAlive(user: string, server: string): Promise<IIdleState>;
  stopServer(): Promise<IStopState>;
  stopState(): Promise<IStopState | null>;
}

/**
 * What the page says once the server it belongs to no longer answers after a
 * stop request. (The page cannot see the hub finish: its API needs the hub's
 * own XSRF token, which a lab page does not have. The hub home shows it.)
 */
export const STOPPING =
  'This server is stopping: the hub has taken it off the network and releases its GPU as soon as the ' +
  'server has shut down (running kernels first). Your files are kept; the hub home shows when it has stopped.';

/** Where the data stands: `loading` until the first answer, then `ok` or why gpulab is absent. */
export type HubState = 'loading' | 'ok' | Absence;

export interface IGpuStatusOptions {
  client: IGpuLabClient;
  /** Milliseconds between ticks while all is well. */
  interval?: number;
  /** Milliseconds between ticks while one of the user's jobs is queued, running or preempted. */
  activeInterval?: number;
  /** Longest wait between ticks while backing off after errors. */
  maxInterval?: number;
  /** The quota and idle state are asked every `slowEvery` ticks (and whenever a job changes). */
  slowEvery?: number;
  /** Samples kept for the utilisation sparkline. */
  historySize?: number;
  /** Poll standby; `when-hidden` (the default) stops asking while the tab is hidden. */
  standby?: Poll.Standby | (() => boolean | Poll.Standby);
}

/** Errors of the last tick, by part; absent when that part answered. */
export interface IPartErrors {
  session?: string;
  me?: string;
  jobs?: string;
  idle?: string;
}

function jobsSignature(jobs: IJob[] | null): string {
  return (jobs ?? []).map(j => `${String(j.id)}:${j.state}`).join(',');
}

export class GpuStatusModel {
  constructor(options: IGpuStatusOptions) {
    this._client = options.client;
    this._slowEvery = Math.max(1, options.slowEvery ?? 3);
    this._interval = options.interval ?? 5000;
    this._activeInterval = Math.min(options.activeInterval ?? 1000, this._interval);
    this._historySize = options.historySize ?? 30;
    this._poll = new Poll({
      factory: () => this._tick(),
      frequency: {
        interval: this._interval,
        backoff: true,
        max: options.maxInterval ?? 5 * 60 * 1000
      },
      name: 'gpulab:status',
      standby: options.standby ?? 'when-hidden'
    });
    // The countdown of an idle warning: a display clock, running only while there is one.
    this._clock = new Poll({
      auto: false,
      factory: async () => {
        this._now = Date.now();
        this._ticked.emit(this._now);
      },
      frequency: { interval: 1000, backoff: false },
      name: 'gpulab:countdown',
      standby: 'when-hidden'
    });
  }

  /** Any part changed (the sidebar re-renders on this). */
  get changed(): ISignal<this, void> {
    return this._changed;
  }
  get sessionChanged(): ISignal<this, ISession | null> {
    return this._sessionChanged;
  }
  get quotaChanged(): ISignal<this, IMe | null> {
    return this._quotaChanged;
  }
  get idleChanged(): ISignal<this, IIdleState | null> {
    return this._idleChanged;
  }
  get jobsChanged(): ISignal<this, IJob[] | null> {
    return this._jobsChanged;
  }
  get stopChanged(): ISignal<this, IStopState | null> {
    return this._stopChanged;
  }
  /** Once a second while an idle warning counts down (the tab visible). */
  /** The display clock: when the countdown last ticked (or the model last polled). */
  get now(): number {
    return this._now;
  }
  get ticked(): ISignal<this, number> {
    return this._ticked;
  }

  get poll(): Poll {
    return this._poll;
  }
  get hub(): HubState {
    return this._hub;
  }
  get session(): ISession | null {
    return this._session;
  }
  get me(): IMe | null {
    return this._me;
  }
  get idle(): IIdleState | null {
    return this._idle;
  }
  get jobs(): IJob[] | null {
    return this._jobs;
  }
  get stop(): IStopState | null {
    return this._stop;
  }
  get errors(): IPartErrors {
    return this._errors;
  }
  /** When this server stopped answering (ms since the epoch); null while it answers. */
  get lostAt(): number | null {
    return this._lostAt;
  }
  /** Mean utilisation of the session's devices, oldest first. */
  get history(): number[] {
    return this._history;
  }
  get isDisposed(): boolean {
    return this._poll.isDisposed;
  }

  /** Ask everything now (after a submit, a cancel, "Keep my GPU"). */
  refresh(): Promise<void> {
    this._fullNext = true;
    return this._poll.refresh();
  }

  /** "Keep my GPU": the hub's answer replaces the idle state. */
  async keep(): Promise<IIdleState | null> {
    const s = this._session;
    if (!s) {
      return null;
    }
    this._setIdle(await this._client.keepAlive(s.user, s.server_name));
    this._changed.emit();
    return this._idle;
  }

  /** "Stop server and release GPU": the server extension asks the hub and answers at once. */
  async requestStop(): Promise<IStopState> {
    const state = await this._client.stopServer();
    this._stop = state;
    this._stopChanged.emit(state);
    this._changed.emit();
    return state;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll.dispose();
    this._clock.dispose();
    Signal.clearData(this);
  }

  private async _tick(): Promise<void> {
    // While jobs run, the extra ticks between two normal ones ask the jobs only.
    if (this._jobsActive && Date.now() - this._lastNormal < this._interval - 10) {
      return this._jobsTick();
    }
    this._lastNormal = Date.now();
    this._ticks++;
    this._now = Date.now();
    let full = this._fullNext || this._ticks % this._slowEvery === 1 || this._slowEvery === 1;
    this._fullNext = false;
    const errors: IPartErrors = {};
    let failed: unknown = null;

    // 1. This server (the server extension; no hub involved).
    try {
      const s = await this._client.session();
      this._session = s;
      if (s.utilisation.available) {
        const devs = s.utilisation.devices;
        const mean = Math.round(
          devs.reduce((a, d) => a + d.gpu_percent, 0) / Math.max(devs.length, 1)
        );
        this._history = [...this._history.slice(-(this._historySize - 1)), mean];
      }
      this._sessionChanged.emit(s);
      this._lostAt = null;
    } catch (e) {
      this._lostAt = this._lostAt ?? Date.now();
      if (this._stop?.state === 'requested') {
        return this._followStop(); // asked to stop, and the server no longer answers
      }
      if (e instanceof GPULabAPIError && e.status === 404) {
        this._setHub('no-extension');
        this._changed.emit();
        return; // nothing else to ask; the poll keeps its slow pace in case the extension appears
      }
      errors.session = message(e);
      failed = e;
    }

    // 2. The hub: jobs every tick, the rest when due or when a job changed.
    if (this._hub !== 'ok' && this._hub !== 'loading' && !full) {
      this._errors = errors;
      this._changed.emit();
      if (failed) {
        throw failed;
      }
      return; // gpulab is absent: probe again on the next full tick only
    }
    try {
      const jobs = await this._client.jobs();
      const first = this._jobs === null;
      const changed = first || jobsSignature(jobs) !== jobsSignature(this._jobs);
      full = full || changed; // a job started or ended: the quota bar follows at once
      this._setJobs(jobs, changed);
      this._setHub('ok');
    } catch (e) {
      if (this._absent(e)) {
        this._changed.emit();
        this._errors = errors;
        return;
      }
      errors.jobs = message(e);
      failed = failed ?? e;
    }
    if (full) {
      try {
        this._me = await this._client.me();
        this._setHub('ok');
        this._quotaChanged.emit(this._me);
      } catch (e) {
        if (this._absent(e)) {
          this._errors = errors;
          this._changed.emit();
          return;
        }
        errors.me = message(e);
        failed = failed ?? e;
      }
      const s = this._session;
      if (s?.gpu) {
        try {
          this._setIdle(await this._client.idle(s.user, s.server_name));
        } catch (e) {
          if (!(e instanceof GPULabAPIError && e.status === 404)) {
            errors.idle = message(e);
            failed = failed ?? e;
          }
        }
      }
    }
    if (this._stop?.state === 'requested') {
      try {
        const stop = await this._client.stopState();
        if (stop && stop.state !== this._stop.state) {
          this._stop = stop;
          this._stopChanged.emit(stop);
        }
      } catch {
        // the server is going away, as asked: the connection-lost handler tells the user
      }
    }
    this._errors = errors;
    this._changed.emit();
    if (failed) {
      throw failed; // the Poll backs off; what answered is shown meanwhile
    }
  }

  /** An extra tick while jobs run: the jobs only; a change brings the quota and idle state at once. */
  private async _jobsTick(): Promise<void> {
    let jobs: IJob[];
    try {
      jobs = await this._client.jobs();
    } catch {
      this._lastNormal = 0; // the next tick is a normal one: it reports and backs off as usual
      return;
    }
    if (jobsSignature(jobs) === jobsSignature(this._jobs)) {
      return;
    }
    this._fullNext = true;
    this._lastNormal = 0;
    return this._tick();
  }

  /** The new job list; the poll's pace follows whether any job is still queued or running. */
  private _setJobs(jobs: IJob[], changed: boolean): void {
    this._jobs = jobs;
    this._jobsActive = jobs.some(j => !isTerminal(j.state));
    this._poll.frequency = {
      ...this._poll.frequency,
      interval: this._jobsActive ? this._activeInterval : this._interval
    };
    if (changed) {
      this._jobsChanged.emit(jobs);
    }
  }

  /** The server no longer answers after the user asked the hub to stop it: say so, and stop asking. */
  private _followStop(): void {
    this._stop = { ...this._stop!, state: 'stopping', message: STOPPING };
    this._stopChanged.emit(this._stop);
    this._changed.emit();
    this._poll.dispose();
    this._clock.dispose();
  }

  /** Record an absence of gpulab from a hub error; true when it was one. */
  private _absent(e: unknown): boolean {
    if (e instanceof GPULabAPIError && e.absence) {
      this._setHub(e.absence);
      this._jobs = null;
      this._me = null;
      this._setIdle(null);
      return true;
    }
    return false;
  }

  private _setHub(hub: HubState): void {
    this._hub = hub;
  }

  private _setIdle(idle: IIdleState | null): void {
    const before = JSON.stringify(this._idle);
    this._idle = idle;
    if (JSON.stringify(idle) !== before) {
      this._idleChanged.emit(idle);
    }
    if (idle?.warning && !idle.warning.held) {
      void this._clock.start();
    } else {
      void this._clock.stop();
    }
  }

  private _client: IGpuLabClient;
  private _poll: Poll;
  private _clock: Poll;
  private _slowEvery: number;
  private _interval: number;
  private _activeInterval: number;
  /** One of the user's jobs is queued, running or preempted: the poll ticks at `activeInterval`. */
  private _jobsActive = false;
  /** When the last normal (not jobs-only) tick started. */
  private _lastNormal = 0;
  private _historySize: number;
  private _ticks = 0;
  private _fullNext = false;
  private _hub: HubState = 'loading';
  private _session: ISession | null = null;
  private _me: IMe | null = null;
  private _idle: IIdleState | null = null;
  private _jobs: IJob[] | null = null;
  private _stop: IStopState | null = null;
  private _errors: IPartErrors = {};
  private _history: number[] = [];
  private _changed = new Signal<this, void>(this);
  private _sessionChanged = new Signal<this, ISession | null>(this);
  private _quotaChanged = new Signal<this, IMe | null>(this);
  private _idleChanged = new Signal<this, IIdleState | null>(this);
  private _jobsChanged = new Signal<this, IJob[] | null>(this);
  private _stopChanged = new Signal<this, IStopState | null>(this);
  private _ticked = new Signal<this, number>(this);
  private _now = Date.now();
  private _lostAt: number | null = null;
}
