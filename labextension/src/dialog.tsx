/**
 * "Run as GPU job": the form (notebook, name and time limit, job class, team,
 * profile with what a job of that class would get now, parameters from the
 * notebook's `parameters` cell) and the submit loop that shows the API's
 * errors as such. The profile starts as the last one used for a job (kept in
 * the browser's local storage, per hub user), else the server's own.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { ReactWidget } from '@jupyterlab/ui-components';
import React, { useState } from 'react';

import { api } from './api';
import { buildJobRequest, IJobForm, parameterText } from './logic';
import { IJob, IMe, ITeamView, JobClass } from './types';
import { defaultProfile, offerFor, offerLabel } from './viewLogic';

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

function teamOf(me: IMe, name: string): ITeamView | undefined {
  return me.teams.find(t => t.name === name) ?? me.teams[0];
}

function JobFormView({
  me,
  initial,
  errors,
  onChange
}: {
  me: IMe;
  initial: IJobForm;
  errors: string[];
  onChange: (form: IJobForm) => void;
}): JSX.Element {
  const [form, setForm] = useState<IJobForm>(initial);
  const update = (patch: Partial<IJobForm>) => {
    const next = { ...form, ...patch };
    setForm(next);
    onChange(next);
  };
  const team = teamOf(me, form.team);
  const profiles = team?.profiles ?? [];
  const setParam = (i: number, patch: Partial<{ name: string; value: string }>) => {
    const parameters = form.parameters.map((p, j) => (j === i ? { ...p, ...patch } : p));
    update({ parameters });
  };
  const setClass = (jobClass: JobClass) => {
    const current = profiles.find(p => p.slug === form.profile);
    // Keep the choice when this class may use it; else the first profile it may use now.
    const profile =
      current && offerFor(current, jobClass).available
        ? form.profile
        : defaultProfile(team, jobClass, null, null);
    update({ jobClass, profile });
  };
  return (
    <form
      className="gpulab-job-form"
      onSubmit={e => e.preventDefault()}
      aria-label="Run as GPU job"
    >
      {errors.length > 0 && (
        <div className="gpulab-error gpulab-form-errors" role="alert">
          {errors.map((e, i) => (
            <div key={i}>{e}</div>
          ))}
        </div>
      )}
      <label className="gpulab-field">
        <span>Notebook</span>
        <input
          className="jp-mod-styled"
          name="notebook"
          value={form.notebook}
          onChange={e => update({ notebook: e.target.value })}
        />
      </label>
      <div className="gpulab-row">
        <label className="gpulab-field gpulab-grow">
          <span>Name (optional)</span>
          <input
            className="jp-mod-styled"
            name="name"
            value={form.name}
            placeholder="from the notebook"
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
          />
        </label>
      </div>
      <fieldset className="gpulab-field">
        <legend>Job class</legend>
        <div className="gpulab-classes">
          {CLASSES.map(c => (
            <label key={c.value} className="gpulab-radio" title={c.help}>
              <input
                type="radio"
                name="job_class"
                value={c.value}
                checked={form.jobClass === c.value}
                onChange={() => setClass(c.value)}
              />
              <strong>{c.label}</strong> <span className="gpulab-muted">— {c.help}</span>
            </label>
          ))}
        </div>
      </fieldset>
      <div className="gpulab-row">
        {me.teams.length > 1 && (
          <label className="gpulab-field">
            <span>Team</span>
            <select
              className="jp-mod-styled"
              name="team"
              value={form.team}
              onChange={e => {
                const next = teamOf(me, e.target.value);
                update({
                  team: e.target.value,
                  profile: defaultProfile(next, form.jobClass, form.profile, null)
                });
              }}
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
          >
            {form.profile === '' && <option value="">Choose…</option>}
            {profiles.map(p => (
              <option
                key={p.slug}
                value={p.slug}
                disabled={!offerFor(p, form.jobClass).available && p.slug !== form.profile}
              >
                {offerLabel(p, form.jobClass)}
              </option>
            ))}
          </select>
        </label>
      </div>
      {team && <span className="gpulab-muted gpulab-team-summary">{team.summary}</span>}
      <fieldset className="gpulab-field gpulab-params">
        <legend>Parameters</legend>
        {form.parameters.length === 0 && (
          <div className="gpulab-muted">The notebook has no cell tagged “parameters”.</div>
        )}
        {form.parameters.map((p, i) => (
          <div key={i} className="gpulab-param">
            <input
              className="jp-mod-styled"
              aria-label={`Parameter ${i + 1} name`}
              value={p.name}
              onChange={e => setParam(i, { name: e.target.value })}
            />
            <span aria-hidden="true">=</span>
            <input
              className="jp-mod-styled"
              aria-label={`Value of parameter ${p.name || i + 1}`}
              name={`param-${p.name}`}
              value={p.value}
              onChange={e => setParam(i, { value: e.target.value })}
            />
          </div>
        ))}
        <button
          type="button"
          className="jp-mod-styled gpulab-small"
          onClick={() => update({ parameters: [...form.parameters, { name: '', value: '' }] })}
        >
          Add parameter
        </button>
      </fieldset>
    </form>
  );
}

class JobFormBody extends ReactWidget implements Dialog.IBodyWidget<IJobForm> {
  private _form: IJobForm;

  constructor(
    private readonly _me: IMe,
    initial: IJobForm,
    private readonly _errors: string[]
  ) {
    super();
    this._form = initial;
    this.addClass('gpulab-job-dialog');
  }

  getValue(): IJobForm {
    return this._form;
  }

  render(): JSX.Element {
    return (
      <JobFormView
        me={this._me}
        initial={this._form}
        errors={this._errors}
        onChange={f => (this._form = f)}
      />
    );
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
 * and profile of the last job, else the server's own team and profile.
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
    profile: defaultProfile(
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
    name: ''
  };
}

/**
 * Show the dialog until the job is submitted or the user cancels. Problems in
 * the form and errors answered by the API are shown in the dialog itself.
 */
export async function runJobDialog(me: IMe, form: IJobForm): Promise<IJob | null> {
  let errors: string[] = [];
  if (me.teams.length === 0) {
    errors = ['You are not in any gpulab team, so you cannot run GPU jobs.'];
  }
  for (;;) {
    const body = new JobFormBody(me, form, errors);
    const result = await showDialog<IJobForm>({
      title: 'Run as GPU job',
      body,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Submit job' })],
      focusNodeSelector: 'select[name="profile"]'
    });
    if (!result.button.accept || result.value === null) {
      return null;
    }
    form = result.value;
    const built = buildJobRequest(form);
    if (built.request === null) {
      errors = built.errors;
      continue;
    }
    try {
      return await api.submit(built.request);
    } catch (e) {
      errors = [`The hub refused the job: ${e instanceof Error ? e.message : String(e)}`];
    }
  }
}
