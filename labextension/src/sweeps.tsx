/**
 * The sidebar's sweeps: each of the user's sweeps with its runs' counts, and the
 * opened one as a table of its runs' parameters, state and metrics, sortable by
 * any column, the best run (by the sweep's objective) marked, each run's output
 * notebook (or log) one click away. Cancel cancels every run not finished.
 *
 * The table marks its renders in the page's performance timeline
 * (`gpulab-sweep-table`, from the data's or a sort's arrival to the committed DOM):
 * the benchmark (benchmarks/sweep_table.py) reads it.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Button, ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import React, { useLayoutEffect, useState } from 'react';

import { api } from './api';
import { message } from './errors';
import { IJobActions } from './jobs';
import {
  cellText,
  columnId,
  countsText,
  ISort,
  nextSort,
  sortRuns,
  sweepColumns
} from './sweepLogic';
import { markTableStart, SweepsModel, takeTableStart } from './sweepsModel';
import { ISweep, ISweepRun } from './types';

/** The performance measure the table records for each render. */
export const TABLE_MEASURE = 'gpulab-sweep-table';

const FINAL = ['succeeded', 'failed', 'cancelled', 'timed-out'];

async function confirmCancel(sweep: ISweep): Promise<boolean> {
  const result = await showDialog({
    title: `Cancel sweep #${String(sweep.id)}?`,
    body:
      `Every run of “${sweep.name}” that has not finished stops now, and no run waiting is ` +
      'started. What finished stays, with its outputs and metrics.',
    buttons: [
      Dialog.cancelButton({ label: 'Keep running' }),
      Dialog.warnButton({ label: 'Cancel sweep' })
    ]
  });
  return result.button.accept;
}

function RunActions({
  sweep,
  run,
  actions,
  report
}: {
  sweep: ISweep;
  run: ISweepRun;
  actions: IJobActions;
  report: (text: string) => void;
}): JSX.Element | null {
  if (run.job_id === null) {
    return null;
  }
  const jobId = run.job_id;
  const open = async (what: 'output' | 'log') => {
    try {
      const job = await api.job(jobId);
      if (what === 'output') {
        await actions.openOutput(job);
      } else {
        actions.openLogs(job);
      }
    } catch (e) {
      report(`Opening run ${run.index} failed: ${message(e)}`);
    }
  };
  const notebook = sweep.kind !== 'script';
  return notebook ? (
    <button
      className="jp-mod-styled gpulab-small gpulab-run-output"
      aria-label={`Open the output notebook of run ${run.index}`}
      disabled={!FINAL.includes(run.state) && run.state !== 'running'}
      onClick={() => void open('output')}
    >
      Output
    </button>
  ) : (
    <button
      className="jp-mod-styled gpulab-small gpulab-run-log"
      aria-label={`Open the log of run ${run.index}`}
      onClick={() => void open('log')}
    >
      Log
    </button>
  );
}

/** One sweep's runs as a table; the header buttons sort it. */
export function SweepTable({
  sweep,
  actions,
  report
}: {
  sweep: ISweep;
  actions: IJobActions;
  report: (text: string) => void;
}): JSX.Element {
  const [sort, setSort] = useState<ISort>({ column: 'index:index', direction: 'ascending' });
  const columns = sweepColumns(
    sweep.parameter_names,
    sweep.metric_names,
    sweep.objective?.metric ?? null
  );
  const rows = sortRuns(sweep.runs ?? [], columns, sort);
  useLayoutEffect(() => {
    // From the data's (or the sort's) arrival to this DOM, in the page's timeline (the benchmark reads it).
    const start = takeTableStart();
    if (start !== null) {
      performance.measure(TABLE_MEASURE, { start, end: performance.now() });
    }
  });
  const objective = sweep.objective;
  return (
    <div className="gpulab-sweep-table-wrap">
      <table
        className="gpulab-sweep-table"
        aria-label={`Runs of sweep ${sweep.name}`}
        data-sweep-id={String(sweep.id)}
      >
        <thead>
          <tr>
            {columns.map(c => {
              const id = columnId(c);
              const sorted = sort.column === id ? sort.direction : undefined;
              return (
                <th
                  key={id}
                  scope="col"
                  aria-sort={sorted ?? 'none'}
                  className={`gpulab-col-${c.kind}`}
                >
                  <button
                    className="gpulab-sort"
                    data-column={id}
                    title={`Sort by ${c.label}`}
                    onClick={() => {
                      markTableStart();
                      setSort(s => nextSort(s, id));
                    }}
                  >
                    {c.label}
                    {objective && c.kind === 'metric' && c.key === objective.metric && (
                      <span className="gpulab-muted"> ({objective.direction})</span>
                    )}
                    <span aria-hidden="true" className="gpulab-sort-mark">
                      {sorted === 'ascending' ? ' ▲' : sorted === 'descending' ? ' ▼' : ''}
                    </span>
                  </button>
                </th>
              );
            })}
            <th scope="col">
              <span className="gpulab-visually-hidden">Open</span>
            </th>
          </tr>
        </thead>
        <tbody>
          {rows.map(run => (
            <tr
              key={run.index}
              data-run-index={String(run.index)}
              data-state={run.state}
              className={run.best ? 'gpulab-best-run' : undefined}
              title={run.reason || undefined}
            >
              {columns.map(c =>
                c.kind === 'state' ? (
                  <td key={columnId(c)}>
                    <span className={`gpulab-state gpulab-state-${run.state}`}>{run.state}</span>
                  </td>
                ) : (
                  <td
                    key={columnId(c)}
                    className={c.kind === 'parameter' ? undefined : 'gpulab-num'}
                  >
                    {c.kind === 'index' && run.best ? (
                      <>
                        {cellText(run, c)}{' '}
                        <span className="gpulab-best-mark" aria-label="best run">
                          ★ best
                        </span>
                      </>
                    ) : (
                      cellText(run, c)
                    )}
                  </td>
                )
              )}
              <td>
                <RunActions sweep={sweep} run={run} actions={actions} report={report} />
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

/** What the sweeps' views ask of the rest of the extension. */
export interface ISweepActions extends IJobActions {
  /** Open a sweep's table in a tab of the main area (room for many columns and rows). */
  openSweep?: (sweep: ISweep) => void;
}

/** The sidebar section: the user's sweeps; the opened one as its table. */
export function SweepsSection({
  model,
  actions,
  report
}: {
  model: SweepsModel;
  actions: ISweepActions;
  report: (text: string) => void;
}): JSX.Element | null {
  const sweeps = model.sweeps;
  if (sweeps !== null && sweeps.length === 0 && !model.error) {
    return null; // no sweeps: nothing to show (the dialog offers them)
  }
  const open = model.open;
  return (
    <section className="gpulab-section gpulab-sweeps" aria-labelledby="gpulab-sweeps-h">
      <h3 id="gpulab-sweeps-h">Sweeps</h3>
      {model.error && (
        <div className="gpulab-error" role="alert">
          Sweeps: {model.error}
        </div>
      )}
      <ul className="gpulab-sweep-list" aria-label="Your parameter sweeps">
        {(sweeps ?? []).map(s => {
          const expanded = model.openId === s.id;
          return (
            <li
              key={s.id}
              className="gpulab-sweep"
              data-sweep-id={String(s.id)}
              data-state={s.state}
            >
              <div className="gpulab-job-head">
                <button
                  className="gpulab-sweep-open"
                  aria-expanded={expanded}
                  onClick={() => void model.select(expanded ? null : s.id)}
                >
                  <span className="gpulab-job-id gpulab-muted">#{String(s.id)}</span> {s.name}
                </button>
                <span className={`gpulab-state gpulab-state-${s.state}`}>{s.state}</span>
              </div>
              <div className="gpulab-job-meta gpulab-muted">
                <span>{countsText(s.runs_total, s.counts)}</span>
                <span>at most {s.max_parallel} at once</span>
                {s.objective && (
                  <span>
                    best by {s.objective.metric} ({s.objective.direction})
                    {s.best_run !== null ? `: run ${s.best_run}` : ''}
                  </span>
                )}
              </div>
              {expanded && open?.id === s.id && (
                <>
                  {!open.metrics_readable && (
                    <div className="gpulab-muted" role="note">
                      The hub does not see the homes here, so it reads no metrics back.
                    </div>
                  )}
                  <SweepTable sweep={open} actions={actions} report={report} />
                </>
              )}
              {expanded && actions.openSweep && (
                <Button
                  small
                  className="jp-mod-styled gpulab-sweep-tab"
                  aria-label={`Open sweep ${s.name} in a tab`}
                  onClick={() => actions.openSweep?.(s)}
                >
                  Open in a tab
                </Button>
              )}
              {expanded && s.state === 'active' && (
                <Button
                  small
                  className="jp-mod-styled gpulab-sweep-cancel"
                  aria-label={`Cancel sweep ${s.name}`}
                  onClick={async () => {
                    if (!(await confirmCancel(s))) {
                      return;
                    }
                    try {
                      await api.cancelSweep(s.id);
                      report(`Cancelled sweep ${s.name}`);
                      await model.refresh();
                    } catch (e) {
                      report(`Cancel failed: ${message(e)}`);
                    }
                  }}
                >
                  Cancel sweep
                </Button>
              )}
            </li>
          );
        })}
      </ul>
    </section>
  );
}

/** One sweep's table in a main-area tab: its own model (one poll for this sweep), disposed with the tab. */
export class SweepTab extends ReactWidget {
  constructor(
    private readonly _model: SweepsModel,
    private readonly _actions: IJobActions
  ) {
    super();
    this.addClass('gpulab-sweep-tab-widget');
  }

  dispose(): void {
    this._model.dispose();
    super.dispose();
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this._model.changed}>
        {() => {
          const sweep = this._model.open;
          if (!sweep) {
            return (
              <div className="gpulab-muted gpulab-placeholder">
                {this._model.error ?? 'Loading…'}
              </div>
            );
          }
          return (
            <div className="gpulab-sweep-tab-body">
              <h2>
                Sweep #{String(sweep.id)} {sweep.name}{' '}
                <span className={`gpulab-state gpulab-state-${sweep.state}`}>{sweep.state}</span>
              </h2>
              <p className="gpulab-muted">
                {countsText(sweep.runs_total, sweep.counts)}; at most {sweep.max_parallel} at once
                {sweep.objective
                  ? `; best by ${sweep.objective.metric} (${sweep.objective.direction})`
                  : ''}
              </p>
              <SweepTable sweep={sweep} actions={this._actions} report={() => undefined} />
            </div>
          );
        }}
      </UseSignal>
    );
  }
}
