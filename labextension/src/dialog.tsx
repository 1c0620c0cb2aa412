/**
 * "Run as GPU job": the form (notebook or script, name and time limit, job class, team,
 * profile with what a job of that class would get now, parameters from the
 * notebook's `parameters` cell, or a script's arguments and, for training, its nodes
 * with their total "2 × 8 H100 = 16 GPUs"), optionally a sweep's grid (each
 * combination a run of its own, at most N at once) and the submit loop that shows the API's
 * errors in the dialog. The profile starts as the last one used for a job
 * (kept in the browser's local storage, per hub user), else the server's own,
 * when it fits now. After that the dialog never changes a choice: a choice
 * that stops fitting stays selected, marked, with the reason and what to do,
 * and Submit waits (or a training job may go as batch instead).
 *
 * The dialog is modal and follows the WAI-ARIA dialog pattern (./modal.ts).
 */
import { ReactWidget } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';
import React, { useEffect, useRef, useState } from 'react';

import { api } from './api';
import { anyProfile, choiceStatus, initialProfile, profileOptionLabel } from './jobChoice';
import {
  buildJobRequest,
  FieldErrors,
  fieldErrors,
  IJobForm,
  isScript,
  nodesTotal,
  parameterText
} from './logic';
import { FieldError, invalid, ParameterFields, SweepFields } from './jobFields';
import { trapFocus } from './modal';
import {
  buildSweepRequest,
  EMPTY_SWEEP,
  gridRuns,
  isSweep,
  ISweepForm,
  parseGrid,
  sweepErrors
} from './sweepLogic';
import { IJob, IMe, ISweep, ITeamView, JobClass } from './types';

const CLASSES = [
  {
    value: 'batch',
    label: 'Batch',
    help: 'may borrow idle GPUs above the guarantee (then preemptible)'
  },
  {
    value: 'training',
    label: 'Training',
    help: 'within the team guarantee only; never preempted by batch work'
  }
] as const;

const TITLE_ID = 'gpulab-job-dialog-title';
const STATUS_ID = 'gpulab-job-choice-status';

function teamOf(me: IMe, name: string): ITeamView | undefined {
  return me.teams.find(t => t.name === name) ?? me.teams[0];
}

interface IJobDialogProps {
  me: IMe;
  initial: IJobForm;
  /** Send the form (a sweep when a grid was typed); resolves to the hub's refusal, or null once submitted. */
  submit: (form: IJobForm, sweep: ISweepForm) => Promise<string | null>;
  cancel: () => void;
}

function JobDialogView({ me, initial, submit, cancel }: IJobDialogProps): JSX.Element {
  const [form, setForm] = useState<IJobForm>(initial);
  const [sweep, setSweep] = useState<ISweepForm>(EMPTY_SWEEP);
  const updateSweep = (patch: Partial<ISweepForm>) => setSweep(s => ({ ...s, ...patch }));
  const sweeping = isSweep(sweep);
  const sweepProblems = sweepErrors(sweep);
  const runs = sweeping ? gridRuns(parseGrid(sweep.grid).grid) : 0;
  const [refusal, setRefusal] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  // Field errors show once a field was left or Submit was pressed, not while the user types the first time.
  const [shown, setShown] = useState<Set<string>>(new Set());
  const rootRef = useRef<HTMLDivElement>(null);
  const update = (patch: Partial<IJobForm>) => setForm(f => ({ ...f, ...patch }));
  const team = teamOf(me, form.team);
  const profiles = team?.profiles ?? [];
  const status = choiceStatus(team, form.profile, form.jobClass);
  const errors: FieldErrors = fieldErrors(form);
  const visible = (key: string): string | undefined =>
    shown.has(key) || shown.has('*') ? errors[key as keyof FieldErrors] : undefined;
  const touch = (key: string) => setShown(s => new Set(s).add(key));
  const gridError = shown.has('grid') || shown.has('*') ? sweepProblems.grid : undefined;
  const script = isScript(form.notebook);
  const chosen = profiles.find(p => p.slug === form.profile);
  const nodes = Number(form.nodes ?? '1');
  const chosenElsewhere =
    form.profile && !profiles.some(p => p.slug === form.profile)
      ? anyProfile(me, form.profile)
      : undefined;

  useEffect(() => {
    const root = rootRef.current;
    if (!root) {
      return;
    }
    const release = trapFocus(root, cancel); // first: it remembers where focus was
    root.querySelector<HTMLElement>('input[name="notebook"]')?.focus();
    return release;
  }, [cancel]);

  const send = async (jobClass: JobClass) => {
    const next = { ...form, jobClass };
    const problems = { ...fieldErrors(next), ...sweepErrors(sweep) };
    if (Object.keys(problems).length > 0) {
      setShown(new Set(['*']));
      const first = Object.keys(problems)[0];
      const selector = first.startsWith('param-')
        ? `[data-param-name="${first.slice(6)}"]`
        : `[name="${first}"]`;
      rootRef.current?.querySelector<HTMLElement>(selector)?.focus();
      return;
    }
    if (!choiceStatus(team, next.profile, jobClass).fits) {
      return;
    }
    setBusy(true);
    setForm(next);
    const refused = await submit(next, sweep);
    setBusy(false);
    setRefusal(refused);
  };
  const setParam = (i: number, patch: Partial<{ name: string; value: string }>) =>
    update({ parameters: form.parameters.map((p, j) => (j === i ? { ...p, ...patch } : p)) });
  const removeParam = (i: number) => {
    update({ parameters: form.parameters.filter((_, j) => j !== i) });
    // Focus stays in the list: the next row's name, else "Add parameter".
    window.requestAnimationFrame(() => {
      const root = rootRef.current;
      const next =
        root?.querySelector<HTMLElement>(`[data-param-name="${i}"]`) ??
        root?.querySelector<HTMLElement>(`[data-param-name="${i - 1}"]`) ??
        root?.querySelector<HTMLElement>('.gpulab-add-param');
      next?.focus();
    });
  };
  const onEnter = (e: React.KeyboardEvent) => {
    const el = e.target as HTMLElement;
    if (e.key === 'Enter' && el.tagName === 'INPUT' && (el as HTMLInputElement).type !== 'radio') {
      e.preventDefault();
      void send(form.jobClass);
    }
  };

  return (
    <div
      className="jp-Dialog-content gpulab-job-dialog"
      role="dialog"
      aria-modal="true"
      aria-labelledby={TITLE_ID}
      ref={rootRef}
    >
      <div className="jp-Dialog-header">
        <h2 id={TITLE_ID} className="jp-Dialog-title gpulab-dialog-title">
          Run as GPU job
        </h2>
      </div>
      <div className="jp-Dialog-body">
        <form
          className="gpulab-job-form"
          onSubmit={e => e.preventDefault()}
          onKeyDown={onEnter}
          aria-labelledby={TITLE_ID}
          noValidate
        >
          {refusal && (
            <div className="gpulab-error gpulab-form-errors" role="alert">
              {refusal}
            </div>
          )}
          <label className="gpulab-field">
            <span>Notebook or script</span>
            <input
              className="jp-mod-styled"
              name="notebook"
              value={form.notebook}
              placeholder="experiments/train.ipynb or train.py"
              onChange={e => update({ notebook: e.target.value })}
              onBlur={() => touch('notebook')}
              {...invalid('gpulab-err-notebook', visible('notebook'))}
            />
            <FieldError id="gpulab-err-notebook" text={visible('notebook')} />
          </label>
          {script && (
            <label className="gpulab-field">
              <span>Arguments</span>
              <input
                className="jp-mod-styled"
                name="args"
                value={form.args ?? ''}
                placeholder="--epochs 3"
                onChange={e => update({ args: e.target.value })}
                onBlur={() => touch('args')}
                {...invalid('gpulab-err-args', visible('args'))}
              />
              <FieldError id="gpulab-err-args" text={visible('args')} />
            </label>
          )}
          <div className="gpulab-row">
            <label className="gpulab-field gpulab-grow">
              <span>Name (optional)</span>
              <input
                className="jp-mod-styled"
                name="name"
                value={form.name}
                placeholder="from the file name"
                onChange={e => update({ name: e.target.value })}
              />
            </label>
            <label className="gpulab-field gpulab-time-limit">
              <span>Time limit (min)</span>
              <input
                className="jp-mod-styled"
                name="time_limit"
                type="number"
                min={1}
                step={1}
                value={form.timeLimitMinutes}
                onChange={e => update({ timeLimitMinutes: e.target.value })}
                onBlur={() => touch('time_limit')}
                {...invalid('gpulab-err-time-limit', visible('time_limit'))}
              />
            </label>
          </div>
          <FieldError id="gpulab-err-time-limit" text={visible('time_limit')} />
          <fieldset className="gpulab-field">
            <legend>Job class</legend>
            <div className="gpulab-classes">
              {CLASSES.map(c => (
                <label key={c.value} className="gpulab-radio">
                  <input
                    type="radio"
                    name="job_class"
                    value={c.value}
                    checked={form.jobClass === c.value}
                    onChange={() => update({ jobClass: c.value })}
                    aria-label={c.label}
                    aria-describedby={`gpulab-class-help-${c.value}`}
                  />
                  <strong>{c.label}</strong>{' '}
                  <span className="gpulab-muted" id={`gpulab-class-help-${c.value}`}>
                    — {c.help}
                  </span>
                </label>
              ))}
            </div>
          </fieldset>
          <div className="gpulab-row">
            {me.teams.length > 1 && (
              <label className="gpulab-field gpulab-team-field">
                <span>Team</span>
                <select
                  className="jp-mod-styled"
                  name="team"
                  value={form.team}
                  onChange={e => update({ team: e.target.value })}
                >
                  {me.teams.map(t => (
                    <option key={t.name} value={t.name}>
                      {t.display_name || t.name}
                    </option>
                  ))}
                </select>
              </label>
            )}
            <label className="gpulab-field gpulab-grow">
              <span>GPU profile</span>
              <select
                className="jp-mod-styled"
                name="profile"
                value={form.profile}
                onChange={e => update({ profile: e.target.value })}
                aria-invalid={!status.fits}
                aria-describedby={STATUS_ID}
              >
                {form.profile === '' && <option value="">Choose…</option>}
                {chosenElsewhere && (
                  <option value={chosenElsewhere.slug}>
                    {profileOptionLabel(chosenElsewhere, form.jobClass, team)}
                  </option>
                )}
                {profiles.map(p => (
                  <option key={p.slug} value={p.slug}>
                    {profileOptionLabel(p, form.jobClass, team)}
                  </option>
                ))}
              </select>
            </label>
          </div>
          {script && form.jobClass === 'training' && (
            <label className="gpulab-field gpulab-nodes">
              <span>Nodes</span>
              <input
                className="jp-mod-styled"
                name="nodes"
                type="number"
                min={1}
                step={1}
                value={form.nodes ?? '1'}
                onChange={e => update({ nodes: e.target.value })}
                onBlur={() => touch('nodes')}
                aria-describedby="gpulab-nodes-total"
                {...invalid('gpulab-err-nodes', visible('nodes'))}
              />
              {chosen && Number.isInteger(nodes) && nodes >= 1 && (
                <span id="gpulab-nodes-total" className="gpulab-muted">
                  {nodesTotal(nodes, chosen.gpu_milli, chosen.gpu_model)}
                  {nodes > 1 ? ', admitted all at once or not at all' : ''}
                </span>
              )}
              <FieldError id="gpulab-err-nodes" text={visible('nodes')} />
            </label>
          )}
          <div
            id={STATUS_ID}
            className={
              status.fits
                ? 'gpulab-muted gpulab-choice-status'
                : 'gpulab-choice-status gpulab-choice-refused'
            }
            aria-live="polite"
          >
            {status.fits ? (
              <span className="gpulab-team-summary">
                {status.overQuota ? 'Runs above the team guarantee: preemptible. ' : ''}
                {team?.summary}
              </span>
            ) : (
              <>
                <strong className="gpulab-choice-reason">
                  {form.profile ? 'Does not fit now: ' : ''}
                  {status.reason}
                </strong>
                {status.todo && <span className="gpulab-todo"> {status.todo}</span>}
                {status.batchFits && (
                  <span className="gpulab-todo">
                    {' '}
                    As a batch job it would run now, above the guarantee (preemptible).
                  </span>
                )}
              </>
            )}
          </div>
          {!script && (
            <ParameterFields
              parameters={form.parameters}
              setParam={setParam}
              removeParam={removeParam}
              add={() => update({ parameters: [...form.parameters, { name: '', value: '' }] })}
              visible={visible}
              touch={touch}
            />
          )}
          <SweepFields
            sweep={sweep}
            update={updateSweep}
            script={script}
            jobClass={form.jobClass}
            gridError={gridError}
            touch={touch}
          />
        </form>
      </div>
      <div className="jp-Dialog-footer">
        <div className="jp-Dialog-footerButtons">
          {status.batchFits && (
            <button
              type="button"
              className="jp-Dialog-button jp-mod-styled gpulab-batch-instead"
              disabled={busy}
              onClick={() => void send('batch')}
            >
              Submit as batch instead (preemptible)
            </button>
          )}
          <button
            type="button"
            className="jp-Dialog-button jp-mod-reject jp-mod-styled"
            onClick={cancel}
          >
            Cancel
          </button>
          <button
            type="button"
            className="jp-Dialog-button jp-mod-accept jp-mod-styled"
            disabled={!status.fits || busy}
            aria-describedby={status.fits ? undefined : STATUS_ID}
            onClick={() => void send(form.jobClass)}
          >
            {busy ? 'Submitting…' : sweeping ? `Submit sweep (${runs} runs)` : 'Submit job'}
          </button>
        </div>
      </div>
    </div>
  );
}

/** The dialog's host: a full-window backdrop over the lab, as JupyterLab's dialogs have. */
class JobDialog extends ReactWidget {
  constructor(private readonly _props: IJobDialogProps) {
    super();
    this.addClass('jp-Dialog');
    this.addClass('jp-ThemedContainer');
    this.addClass('gpulab-job-dialog-host');
  }

  render(): JSX.Element {
    return <JobDialogView {...this._props} />;
  }
}

/** What the dialog remembers between jobs, per hub user, in the browser's local storage. */
export interface ILastJobChoice {
  team: string;
  profile: string;
}

const LAST_JOB_KEY = 'gpulab-labextension:last-job:';

/** The team and profile of `user`'s last job from this browser, if any (and readable). */
export function rememberedJobChoice(user: string): ILastJobChoice | null {
  try {
    const data = JSON.parse(window.localStorage.getItem(LAST_JOB_KEY + user) ?? 'null');
    return data && typeof data.team === 'string' && typeof data.profile === 'string' ? data : null;
  } catch {
    return null; // storage disabled or a value we did not write: start from the server's profile
  }
}

export function rememberJobChoice(user: string, choice: ILastJobChoice): void {
  try {
    window.localStorage.setItem(LAST_JOB_KEY + user, JSON.stringify(choice));
  } catch {
    // storage full or disabled: the next dialog starts from the server's profile
  }
}

/**
 * The form's starting values for `notebook` with its `parameters`: the team
 * and profile of the last job, else the server's own team and profile, when a
 * batch job may use that profile now (else the first that fits, else none).
 */
export function initialForm(
  me: IMe,
  notebook: string,
  parameters: Record<string, unknown>,
  session: { team: string | null; profile: string | null } | null,
  last: ILastJobChoice | null
): IJobForm {
  const byName = (name: string | null | undefined) =>
    name ? me.teams.find(x => x.name === name) : undefined;
  const t = byName(last?.team) ?? byName(session?.team) ?? me.teams[0];
  const lastProfile = last && t && last.team === t.name ? last.profile : null;
  return {
    notebook,
    jobClass: 'batch',
    team: t?.name ?? '',
    profile: initialProfile(
      t,
      'batch',
      lastProfile,
      session?.team === t?.name ? (session?.profile ?? null) : null
    ),
    parameters: Object.entries(parameters).map(([name, value]) => ({
      name,
      value: parameterText(value)
    })),
    timeLimitMinutes: '60',
    name: '',
    args: '',
    nodes: '1'
  };
}

/**
 * Show the dialog until the job is submitted or the user cancels. Problems in
 * the form are said at their fields; what the hub refuses, at the top.
 */
export function runJobDialog(me: IMe, form: IJobForm): Promise<IJob | ISweep | null> {
  return new Promise(resolve => {
    let dialog: JobDialog | null = null;
    const close = (job: IJob | ISweep | null) => {
      dialog?.dispose();
      dialog = null;
      resolve(job);
    };
    const submit = async (f: IJobForm, sweep: ISweepForm): Promise<string | null> => {
      if (isSweep(sweep)) {
        const built = buildSweepRequest(f, sweep);
        if (built.request === null) {
          return built.errors.join(' ');
        }
        try {
          close(await api.submitSweep(built.request));
          return null;
        } catch (e) {
          return `The hub refused the sweep: ${e instanceof Error ? e.message : String(e)}`;
        }
      }
      const built = buildJobRequest(f);
      if (built.request === null) {
        return built.errors.join(' ');
      }
      try {
        close(await api.submit(built.request));
        return null;
      } catch (e) {
        return `The hub refused the job: ${e instanceof Error ? e.message : String(e)}`;
      }
    };
    dialog = new JobDialog({ me, initial: form, submit, cancel: () => close(null) });
    Widget.attach(dialog, document.body);
  });
}
