/**
 * The job dialog's repeated fields: a notebook's parameters (name = value rows) and a
 * sweep's grid with its cap on runs at once and the metric that marks the best run.
 * Each field shows its error under itself once it was left or Submit was pressed.
 */
import React from 'react';

import { IJobForm } from './logic';
import { gridRuns, isSweep, ISweepForm, parseGrid, sweepErrors } from './sweepLogic';
import { JobClass } from './types';

/** A field's error, under the field; the field points at it (aria-describedby) and is marked invalid. */
export function FieldError({
  id,
  text
}: {
  id: string;
  text: string | undefined;
}): JSX.Element | null {
  return text ? (
    <span id={id} className="gpulab-field-error">
      {text}
    </span>
  ) : null;
}

/** The attributes that mark a field invalid and point at its error. */
export function invalid(
  id: string,
  text: string | undefined
): { 'aria-invalid'?: boolean; 'aria-describedby'?: string } {
  return text ? { 'aria-invalid': true, 'aria-describedby': id } : {};
}

interface IParameterFieldsProps {
  parameters: IJobForm['parameters'];
  setParam: (i: number, patch: Partial<{ name: string; value: string }>) => void;
  removeParam: (i: number) => void;
  add: () => void;
  /** The error to show for a field key, once shown. */
  visible: (key: string) => string | undefined;
  touch: (key: string) => void;
}

/** A notebook's parameters, one name = value row each, as papermill injects them. */
export function ParameterFields({
  parameters,
  setParam,
  removeParam,
  add,
  visible,
  touch
}: IParameterFieldsProps): JSX.Element {
  return (
    <fieldset className="gpulab-field gpulab-params">
      <legend>Parameters</legend>
      {parameters.length === 0 && (
        <div className="gpulab-muted">
          No parameters (the notebook’s cell tagged “parameters” sets none).
        </div>
      )}
      {parameters.map((p, i) => {
        const err = visible(`param-${i}`);
        const label = p.name || `parameter ${i + 1}`;
        return (
          <div key={i} className="gpulab-param-row">
            <div className="gpulab-param">
              <input
                className="jp-mod-styled"
                aria-label={`Name of parameter ${i + 1}`}
                data-param-name={i}
                value={p.name}
                onChange={e => setParam(i, { name: e.target.value })}
                onBlur={() => touch(`param-${i}`)}
                {...invalid(`gpulab-err-param-${i}`, err)}
              />
              <span aria-hidden="true">=</span>
              <input
                className="jp-mod-styled"
                aria-label={`Value of ${label}`}
                name={`param-${p.name}`}
                value={p.value}
                onChange={e => setParam(i, { value: e.target.value })}
              />
              <button
                type="button"
                className="jp-mod-styled gpulab-small gpulab-remove-param"
                aria-label={`Remove ${label}`}
                title={`Remove ${label}`}
                onClick={() => removeParam(i)}
              >
                Remove
              </button>
            </div>
            <FieldError id={`gpulab-err-param-${i}`} text={err} />
          </div>
        );
      })}
      <button type="button" className="jp-mod-styled gpulab-small gpulab-add-param" onClick={add}>
        Add parameter
      </button>
    </fieldset>
  );
}

interface ISweepFieldsProps {
  sweep: ISweepForm;
  update: (patch: Partial<ISweepForm>) => void;
  script: boolean;
  jobClass: JobClass;
  gridError: string | undefined;
  touch: (key: string) => void;
}

/** A sweep: the grid (one parameter per line), at most N runs at once, and the best run's metric. */
export function SweepFields({
  sweep,
  update,
  script,
  jobClass,
  gridError,
  touch
}: ISweepFieldsProps): JSX.Element {
  const sweeping = isSweep(sweep);
  const sweepProblems = sweepErrors(sweep);
  const runs = sweeping ? gridRuns(parseGrid(sweep.grid).grid) : 0;
  return (
    <details className="gpulab-field gpulab-sweep-fields" open={sweeping}>
      <summary>Sweep: run it once per combination of parameter values</summary>
      <label className="gpulab-field">
        <span>
          Grid, one parameter per line{' '}
          {script ? '(passed as --name value)' : '(over the parameters above)'}
        </span>
        <textarea
          className="jp-mod-styled gpulab-grid"
          name="grid"
          rows={3}
          value={sweep.grid}
          placeholder={'lr = 0.0001, 0.0003, 0.001\nseed = 0, 1'}
          onChange={e => update({ grid: e.target.value })}
          onBlur={() => touch('grid')}
          aria-describedby="gpulab-grid-runs"
          {...invalid('gpulab-err-grid', gridError)}
        />
        <span id="gpulab-grid-runs" className="gpulab-muted gpulab-grid-runs" aria-live="polite">
          {sweeping && !sweepProblems.grid
            ? `${runs} run${runs === 1 ? '' : 's'}, each a ${jobClass} job of its own`
            : 'Empty: one job.'}
        </span>
        <FieldError id="gpulab-err-grid" text={gridError} />
      </label>
      {sweeping && (
        <div className="gpulab-row">
          <label className="gpulab-field gpulab-time-limit">
            <span>At most … at once</span>
            <input
              className="jp-mod-styled"
              name="max_parallel"
              type="number"
              min={1}
              step={1}
              value={sweep.maxParallel}
              placeholder={String(Math.min(runs || 1, 4))}
              onChange={e => update({ maxParallel: e.target.value })}
              {...invalid('gpulab-err-parallel', sweepProblems.max_parallel)}
            />
            <FieldError id="gpulab-err-parallel" text={sweepProblems.max_parallel} />
          </label>
          <label className="gpulab-field gpulab-grow">
            <span>Best run by metric (optional)</span>
            <input
              className="jp-mod-styled"
              name="objective"
              value={sweep.metric}
              placeholder="loss"
              onChange={e => update({ metric: e.target.value })}
            />
          </label>
          <label className="gpulab-field">
            <span>Better</span>
            <select
              className="jp-mod-styled"
              name="direction"
              value={sweep.direction}
              onChange={e => update({ direction: e.target.value as 'min' | 'max' })}
            >
              <option value="min">lower</option>
              <option value="max">higher</option>
            </select>
          </label>
        </div>
      )}
    </details>
  );
}
