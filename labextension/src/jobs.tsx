/**
 * The sidebar's jobs list: one row per job with its id, submit and start
 * time, size, class, run time, state history and actions.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import React from 'react';

import { api } from './api';
import { message } from './errors';
import { canCancel, formatDuration, formatGPUs, isTerminal, jobDuration } from './logic';
import { IJob } from './types';
import { jobHistory, shortTime } from './viewLogic';

/** What a job row asks of the rest of the extension. */
export interface IJobActions {
  openLogs: (job: IJob) => void;
  openOutput: (job: IJob) => Promise<void>;
}

/** Cancel is not undone: ask once, and say what stays. */
async function confirmCancel(job: IJob, title: string): Promise<boolean> {
  const result = await showDialog({
    title: `Cancel job #${String(job.id)}?`,
    body:
      `“${title}” stops now and cannot be resumed. Its log and the output notebook written ` +
      'so far stay; Re-run starts it again from the beginning, with the notebook as it ran.',
    buttons: [
      Dialog.cancelButton({ label: 'Keep running' }),
      Dialog.warnButton({ label: 'Cancel job' })
    ]
  });
  return result.button.accept;
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
  actions: IJobActions;
  report: (text: string) => void;
  reload: () => Promise<void>;
}): JSX.Element {
  const duration = jobDuration(job, now);
  const title = job.name || job.notebook;
  const history = jobHistory(job, now);
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
        <span className="gpulab-job-name" title={job.notebook}>
          <span className="gpulab-job-id gpulab-muted">#{String(job.id)}</span> {title}
        </span>
        <span
          className={`gpulab-state gpulab-state-${job.state}`}
          aria-label={`state ${job.state}`}
        >
          {job.state}
        </span>
      </div>
      <div className="gpulab-job-meta">
        <span>{formatGPUs(job.gpu_milli)} GPU</span>
        <span>{job.job_class}</span>
        <span>{job.profile}</span>
        <span className="gpulab-num">
          {duration === null ? 'not started' : formatDuration(duration)}
        </span>
      </div>
      <div className="gpulab-job-times gpulab-muted">
        <span>
          submitted{' '}
          <time className="gpulab-num gpulab-job-submitted" dateTime={job.created_at}>
            {shortTime(job.created_at, now)}
          </time>
        </span>
        <span>
          started{' '}
          <time className="gpulab-num gpulab-job-started" dateTime={job.started_at ?? ''}>
            {job.started_at ? shortTime(job.started_at, now) : 'not yet'}
          </time>
        </span>
      </div>
      {job.reason && <div className="gpulab-job-reason gpulab-muted">{job.reason}</div>}
      {history.length > 0 && (
        <details className="gpulab-job-history">
          <summary>History ({history.length})</summary>
          <ol aria-label={`State history of job ${String(job.id)}`}>
            {history.map((h, i) => (
              <li key={i}>
                <span className="gpulab-num">{h.at}</span> <strong>{h.state}</strong>
                {h.reason && <span className="gpulab-muted"> — {h.reason}</span>}
              </li>
            ))}
          </ol>
        </details>
      )}
      <div className="gpulab-job-actions">
        <button
          className="jp-mod-styled gpulab-small"
          aria-label={`Logs of job ${title}`}
          onClick={() => actions.openLogs(job)}
        >
          Logs
        </button>
        <button
          className="jp-mod-styled gpulab-small"
          aria-label={`Open the output notebook of job ${title}`}
          disabled={!isTerminal(job.state)}
          onClick={() => act('Opened output', () => actions.openOutput(job))}
        >
          Output
        </button>
        <button
          className="jp-mod-styled gpulab-small"
          aria-label={`Cancel job ${title}`}
          disabled={!canCancel(job)}
          onClick={async () => {
            if (await confirmCancel(job, title)) {
              await act('Cancelled', () => api.cancel(job.id));
            }
          }}
        >
          Cancel
        </button>
        <button
          className="jp-mod-styled gpulab-small gpulab-rerun"
          aria-label={`Run job ${title} again with its notebook as it ran`}
          title={`Runs ${job.input_path || 'the notebook'} as this job ran it, with the same settings`}
          disabled={!isTerminal(job.state)}
          onClick={() => act('Submitted again', () => api.rerun(job.id, 'kept'))}
        >
          Re-run
        </button>
        <button
          className="jp-mod-styled gpulab-small gpulab-rerun-current"
          aria-label={`Run the current ${job.notebook} with the settings of job ${title}`}
          title={`Runs ${job.notebook} as it is now, with the same settings`}
          disabled={!isTerminal(job.state)}
          onClick={() => act('Submitted the current notebook', () => api.rerun(job.id, 'current'))}
        >
          Run current
        </button>
      </div>
    </li>
  );
}

export function JobsList({
  jobs,
  error,
  now,
  actions,
  report,
  reload
}: {
  jobs: IJob[] | null;
  error: string | undefined;
  now: number;
  actions: IJobActions;
  report: (text: string) => void;
  reload: () => Promise<void>;
}): JSX.Element {
  return (
    <>
      {error && (
        <div className="gpulab-error" role="alert">
          Jobs: {error}
        </div>
      )}
      {jobs !== null && jobs.length === 0 && <div className="gpulab-muted">No jobs yet.</div>}
      <ul className="gpulab-jobs" aria-label="Your GPU jobs">
        {(jobs ?? []).map(job => (
          <JobRow
            key={String(job.id)}
            job={job}
            now={now}
            actions={actions}
            report={report}
            reload={reload}
          />
        ))}
      </ul>
    </>
  );
}
