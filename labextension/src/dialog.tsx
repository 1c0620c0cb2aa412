/**
 * "Run as GPU job": the form (notebook, job class, team, profile with
 * availability, parameters from the notebook's `parameters` cell, time limit)
 * and the submit loop that shows the API's errors as such.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { ReactWidget } from '@jupyterlab/ui-components';
import React, { useState } from 'react';

import { api } from './api';
import { buildJobRequest, formatGPUs, IJobForm, parameterText } from './logic';
import { IJob, IMe, ITeamView } from './types';

const CLASSES = [
  { value: 'batch', label: 'Batch', help: 'preemptible, cheapest: runs on otherwise idle GPUs' },
  { value: 'training', label: 'Training', help: 'high priority, preempted only by production; within the team guarantee' }
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
  return (
    <form className="gpulab-job-form" onSubmit={e => e.preventDefault()} aria-label="Run as GPU job">
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
      <fieldset className="gpulab-field">
        <legend>Job class</legend>
        {CLASSES.map(c => (
          <label key={c.value} className="gpulab-radio">
            <input
              type="radio"
              name="job_class"
              value={c.value}
              checked={form.jobClass === c.value}
              onChange={() => update({ jobClass: c.value })}
            />
            <strong>{c.label}</strong> — {c.help}
          </label>
        ))}
      </fieldset>
      {me.teams.length > 1 && (
        <label className="gpulab-field">
          <span>Team</span>
          <select
            className="jp-mod-styled"
            name="team"
            value={form.team}
            onChange={e => update({ team: e.target.value, profile: '' })}
          >
            {me.teams.map(t => (
              <option key={t.name} value={t.name}>
                {t.display_name || t.name}
              </option>
            ))}
          </select>
        </label>
      )}
      <label className="gpulab-field">
        <span>GPU profile</span>
        <select
          className="jp-mod-styled"
          name="profile"
          value={form.profile}
          onChange={e => update({ profile: e.target.value })}
        >
          <option value="">Choose…</option>
          {profiles.map(p => (
            <option key={p.slug} value={p.slug}>
              {p.display_name} ({formatGPUs(p.gpu_milli)} GPU) —{' '}
              {p.available ? (p.over_quota ? 'available, burst' : 'available') : `unavailable now: ${p.reason}`}
            </option>
          ))}
        </select>
        {team && <span className="gpulab-muted">{team.summary}</span>}
      </label>
      <fieldset className="gpulab-field">
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
      <label className="gpulab-field">
        <span>Time limit (minutes)</span>
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
      <label className="gpulab-field">
        <span>Name (optional)</span>
        <input className="jp-mod-styled" name="name" value={form.name} onChange={e => update({ name: e.target.value })} />
      </label>
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
      <JobFormView me={this._me} initial={this._form} errors={this._errors} onChange={f => (this._form = f)} />
    );
  }
}

/** The form's starting values for `notebook` with its `parameters`. */
export function initialForm(me: IMe, notebook: string, parameters: Record<string, unknown>, team?: string | null): IJobForm {
  const t = (team && me.teams.find(x => x.name === team)) || me.teams[0];
  const firstAvailable = t?.profiles.find(p => p.available) ?? t?.profiles[0];
  return {
    notebook,
    jobClass: 'batch',
    team: t?.name ?? '',
    profile: firstAvailable?.slug ?? '',
    parameters: Object.entries(parameters).map(([name, value]) => ({ name, value: parameterText(value) })),
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
