/**
 * The left sidebar "GPU" panel: this session's GPU and its utilisation, the
 * team's quota, any idle warning with "Keep my GPU", and the user's jobs.
 */
import { ReactWidget } from '@jupyterlab/ui-components';
import React, { useCallback, useEffect, useRef, useState } from 'react';

import { api } from './api';
import { GPULabAPIError } from './handler';
import { gpuIcon } from './icons';
import {
  canCancel,
  formatCountdown,
  formatDuration,
  formatGPUs,
  isTerminal,
  jobDuration,
  keepAliveState,
  quotaSegments,
  sparklinePath
} from './logic';
import { IIdleState, IJob, IMe, ISession, ITeamView } from './types';

/** What the panel asks of the rest of the extension. */
export interface IPanelActions {
  runAsJob: () => void;
  openLogs: (job: IJob) => void;
  openOutput: (job: IJob) => Promise<void>;
}

const SPARK_SLOTS = 30;
const SPARK_W = 180;
const SPARK_H = 32;

function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** Poll `fn` every `ms` while mounted; the first call runs at once. */
function usePoll(fn: () => Promise<void>, ms: number, deps: unknown[] = []): void {
  useEffect(() => {
    let stopped = false;
    let timer: number | undefined;
    const tick = async () => {
      try {
        await fn();
      } finally {
        if (!stopped) {
          timer = window.setTimeout(tick, ms);
        }
      }
    };
    void tick();
    return () => {
      stopped = true;
      window.clearTimeout(timer);
    };
  }, deps);
}

function QuotaBar({ team }: { team: ITeamView }): JSX.Element {
  const s = quotaSegments(team);
  return (
    <div className="gpulab-quota">
      <div className="gpulab-quota-title">
        Team <strong>{team.display_name || team.name}</strong>
        <span className="gpulab-muted"> — {team.summary}</span>
      </div>
      <div className="gpulab-quota-bar" role="img" aria-label={s.label} title={s.label}>
        <div className="gpulab-quota-in" style={{ width: `${s.inQuota}%` }} />
        <div className="gpulab-quota-burst" style={{ width: `${s.burst}%` }} />
        <div className="gpulab-quota-free" style={{ width: `${s.free}%` }} />
        <div className="gpulab-quota-guarantee" style={{ left: `${s.guaranteeAt}%` }} aria-hidden="true" />
      </div>
      <div className="gpulab-quota-legend" aria-hidden="true">
        <span><i className="gpulab-swatch gpulab-quota-in" />in quota {formatGPUs(team.in_quota_milli)}</span>
        <span><i className="gpulab-swatch gpulab-quota-burst" />burst {formatGPUs(team.over_quota_milli)}</span>
        <span><i className="gpulab-swatch gpulab-quota-free" />free {formatGPUs(team.free_milli)}</span>
      </div>
    </div>
  );
}

function Sparkline({ values, reason }: { values: number[]; reason: string | null }): JSX.Element {
  if (reason !== null) {
    return (
      <div className="gpulab-spark gpulab-spark-empty" role="note">
        No utilisation data: {reason}
      </div>
    );
  }
  const last = values.length ? values[values.length - 1] : null;
  const label =
    last === null
      ? 'GPU utilisation: waiting for the first sample'
      : `GPU utilisation of the device, last ${values.length} samples, now ${last} percent`;
  return (
    <div className="gpulab-spark">
      <svg width={SPARK_W} height={SPARK_H} role="img" aria-label={label} viewBox={`0 0 ${SPARK_W} ${SPARK_H}`}>
        <rect x={0} y={0} width={SPARK_W} height={SPARK_H} className="gpulab-spark-bg" />
        <path d={sparklinePath(values, SPARK_W, SPARK_H, SPARK_SLOTS)} className="gpulab-spark-line" />
      </svg>
      <span className="gpulab-spark-now">{last === null ? '–' : `${last}%`}</span>
    </div>
  );
}

function IdleWarning({
  idle,
  onKeep
}: {
  idle: IIdleState;
  onKeep: () => Promise<void>;
}): JSX.Element | null {
  const [now, setNow] = useState(Date.now());
  const [busy, setBusy] = useState(false);
  useEffect(() => {
    const t = window.setInterval(() => setNow(Date.now()), 1000);
    return () => window.clearInterval(t);
  }, []);
  if (!idle.warning) {
    return null;
  }
  const keep = keepAliveState(idle);
  return (
    <div className="gpulab-idle" role="alert">
      <div>
        <strong>Idle GPU:</strong> {idle.warning.reason}
      </div>
      {idle.warning.held ? (
        <div className="gpulab-idle-held">On hold: no utilisation data right now; nothing is reclaimed until it returns.</div>
      ) : (
        <div>
          Reclaimed in{' '}
          <span className="gpulab-countdown" role="timer" aria-label="time until the GPU is reclaimed">
            {formatCountdown(idle.warning.reclaim_at, now)}
          </span>
        </div>
      )}
      <button
        className="jp-mod-styled jp-mod-accept gpulab-keep"
        disabled={!keep.enabled || busy}
        title={keep.label}
        aria-label={keep.label}
        onClick={async () => {
          setBusy(true);
          try {
            await onKeep();
          } finally {
            setBusy(false);
          }
        }}
      >
        Keep my GPU
      </button>
      <div className="gpulab-muted">{keep.label}</div>
    </div>
  );
}

function JobRow({
  job,
  now,
  actions,
  report,
  reload
}: {
  job: IJob;
  now: number;
  actions: IPanelActions;
  report: (text: string) => void;
  reload: () => Promise<void>;
}): JSX.Element {
  const duration = jobDuration(job, now);
  const title = job.name || job.notebook;
  const act = async (what: string, fn: () => Promise<unknown>) => {
    try {
      await fn();
      report(`${what}: ${title}`);
      await reload();
    } catch (e) {
      report(`${what} failed: ${message(e)}`);
    }
  };
  return (
    <li className="gpulab-job" data-job-id={String(job.id)} data-state={job.state}>
      <div className="gpulab-job-head">
        <span className="gpulab-job-name" title={job.notebook}>{title}</span>
        <span className={`gpulab-state gpulab-state-${job.state}`} aria-label={`state ${job.state}`}>
          {job.state}
        </span>
      </div>
      <div className="gpulab-job-meta">
        <span>{formatGPUs(job.gpu_milli)} GPU</span>
        <span>{job.job_class}</span>
        <span>{job.profile}</span>
        <span className="gpulab-num">{duration === null ? 'not started' : formatDuration(duration)}</span>
      </div>
      {job.reason && <div className="gpulab-job-reason gpulab-muted">{job.reason}</div>}
      <div className="gpulab-job-actions">
        <button className="jp-mod-styled gpulab-small" aria-label={`Logs of job ${title}`} onClick={() => actions.openLogs(job)}>
          Logs
        </button>
        <button
          className="jp-mod-styled gpulab-small"
          aria-label={`Open the output notebook of job ${title}`}
          disabled={!isTerminal(job.state) || job.state === 'cancelled'}
          onClick={() => act('Opened output', () => actions.openOutput(job))}
        >
          Output
        </button>
        <button
          className="jp-mod-styled gpulab-small"
          aria-label={`Cancel job ${title}`}
          disabled={!canCancel(job)}
          onClick={() => act('Cancelled', () => api.cancel(job.id))}
        >
          Cancel
        </button>
        <button
          className="jp-mod-styled gpulab-small"
          aria-label={`Run job ${title} again`}
          disabled={!isTerminal(job.state)}
          onClick={() => act('Submitted again', () => api.rerun(job.id))}
        >
          Re-run
        </button>
      </div>
    </li>
  );
}

function GPUPanelView({ actions, refreshKey }: { actions: IPanelActions; refreshKey: number }): JSX.Element {
  const [session, setSession] = useState<ISession | null>(null);
  const [sessionError, setSessionError] = useState<string | null>(null);
  const [history, setHistory] = useState<number[]>([]);
  const [me, setMe] = useState<IMe | null>(null);
  const [meError, setMeError] = useState<string | null>(null);
  const [idle, setIdle] = useState<IIdleState | null>(null);
  const [jobs, setJobs] = useState<IJob[] | null>(null);
  const [jobsError, setJobsError] = useState<string | null>(null);
  const [status, setStatus] = useState('');
  const [now, setNow] = useState(Date.now());
  const sessionRef = useRef<ISession | null>(null);

  usePoll(async () => {
    try {
      const s = await api.session();
      sessionRef.current = s;
      setSession(s);
      setSessionError(null);
      if (s.utilisation.available) {
        const devs = s.utilisation.devices;
        const mean = Math.round(devs.reduce((a, d) => a + d.gpu_percent, 0) / Math.max(devs.length, 1));
        setHistory(h => [...h.slice(-(SPARK_SLOTS - 1)), mean]);
      }
    } catch (e) {
      setSessionError(message(e));
    }
  }, 5000);

  const loadMe = useCallback(async () => {
    try {
      setMe(await api.me());
      setMeError(null);
    } catch (e) {
      setMeError(message(e));
    }
  }, []);
  usePoll(loadMe, 15000);
  // The quota bar follows the jobs: reload it when a job starts or ends.
  const jobsSignature = useRef('');

  usePoll(async () => {
    const s = sessionRef.current ?? (await api.session().catch(() => null));
    if (s && s.gpu) {
      try {
        setIdle(await api.idle(s.user, s.server_name));
      } catch {
        setIdle(null); // no idle API on this hub: nothing to warn about
      }
    }
  }, 10000);

  const loadJobs = useCallback(async () => {
    try {
      const list = await api.jobs();
      setJobs(list);
      setJobsError(null);
      const signature = list.map(j => `${String(j.id)}:${j.state}`).join(',');
      if (jobsSignature.current && signature !== jobsSignature.current) {
        void loadMe();
      }
      jobsSignature.current = signature;
    } catch (e) {
      setJobsError(
        e instanceof GPULabAPIError && e.status === 404 ? 'this hub has no jobs API' : message(e)
      );
    }
    setNow(Date.now());
  }, [loadMe]);
  usePoll(loadJobs, 4000, [refreshKey]);

  const team = me && session?.team ? me.teams.find(t => t.name === session.team) : me?.teams[0];
  const utilReason =
    session === null
      ? null
      : session.utilisation.available
        ? null
        : session.utilisation.reason;

  return (
    <div className="gpulab-panel">
      <header className="gpulab-header">
        <gpuIcon.react tag="span" className="gpulab-header-icon" />
        <h2>GPU</h2>
      </header>
      <section className="gpulab-section" aria-labelledby="gpulab-session-h">
        <h3 id="gpulab-session-h">This session</h3>
        {sessionError && <div className="gpulab-error" role="alert">{sessionError}</div>}
        {session === null ? (
          <div className="gpulab-muted gpulab-placeholder">Loading…</div>
        ) : !session.gpu ? (
          <div className="gpulab-muted">This server has no GPU.</div>
        ) : (
          <dl className="gpulab-facts">
            <dt>Profile</dt>
            <dd className="gpulab-profile">{session.profile}</dd>
            <dt>GPU</dt>
            <dd className="gpulab-share">
              {session.share}
              {session.gpu_source === 'declared' ? ' (declared, no driver)' : ''}
            </dd>
            <dt>Devices</dt>
            <dd>{session.devices.join(', ') || '–'}</dd>
            <dt>Quota</dt>
            <dd>{session.preemptible ? 'burst (preemptible)' : 'in quota'}</dd>
          </dl>
        )}
        {session?.gpu && <Sparkline values={history} reason={utilReason} />}
        {idle && session && (
          <IdleWarning
            idle={idle}
            onKeep={async () => {
              try {
                setIdle(await api.keepAlive(session.user, session.server_name));
                setStatus('Your GPU is kept.');
              } catch (e) {
                setStatus(`Keep my GPU failed: ${message(e)}`);
              }
            }}
          />
        )}
        {meError && <div className="gpulab-error" role="alert">Quota: {meError}</div>}
        {team ? <QuotaBar team={team} /> : !meError && <div className="gpulab-quota gpulab-placeholder" />}
      </section>
      <section className="gpulab-section" aria-labelledby="gpulab-jobs-h">
        <div className="gpulab-jobs-head">
          <h3 id="gpulab-jobs-h">Jobs</h3>
          <button className="jp-mod-styled jp-mod-accept gpulab-run" onClick={actions.runAsJob}>
            Run as GPU job…
          </button>
        </div>
        <div className="gpulab-status" role="status" aria-live="polite">
          {status}
        </div>
        {jobsError && <div className="gpulab-error" role="alert">Jobs: {jobsError}</div>}
        {jobs !== null && jobs.length === 0 && <div className="gpulab-muted">No jobs yet.</div>}
        <ul className="gpulab-jobs" aria-label="Your GPU jobs">
          {(jobs ?? []).map(job => (
            <JobRow key={String(job.id)} job={job} now={now} actions={actions} report={setStatus} reload={loadJobs} />
          ))}
        </ul>
      </section>
    </div>
  );
}

/** The sidebar widget. `refresh()` makes the jobs list reload at once. */
export class GPUPanel extends ReactWidget {
  private _refreshKey = 0;

  constructor(private readonly _actions: IPanelActions) {
    super();
    this.id = 'gpulab-panel';
    this.addClass('gpulab-panel-widget');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU: session, quota and jobs';
  }

  refresh(): void {
    this._refreshKey++;
    this.update();
  }

  render(): JSX.Element {
    return <GPUPanelView actions={this._actions} refreshKey={this._refreshKey} />;
  }
}
