/**
 * The left sidebar "GPU" panel: this session's GPU (by the profile's name),
 * its utilisation and idle policy, "Stop server and release GPU", the team's
 * quota, any idle warning with "Keep my GPU", the user's jobs and sweeps.
 *
 * The panel draws what {@link GpuStatusModel} holds and re-renders on its
 * signals; it keeps no timer of its own.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import { ISignal } from '@lumino/signaling';
import React, { useState } from 'react';

import { absenceSentence, message } from './errors';
import { gpuIcon } from './icons';
import { JobsList, IJobActions } from './jobs';
import { formatCountdown, formatGPUs, keepAliveState, quotaSegments, sparklinePath } from './logic';
import { reclaimedMessage, reclaimFromWarning, warnedLifetime } from './idleLogic';
import { GpuStatusModel } from './model';
import { announceStopFailed, announceStopRequested, hubHome } from './stopped';
import { ISweepActions, SweepsSection } from './sweeps';
import { SweepsModel } from './sweepsModel';
import { IGpuSidebar } from './tokens';
import { IIdleState, ISession, ITeamView } from './types';
import { reclaimOffText, sessionProfile, sessionTeam } from './viewLogic';

/** What the panel asks of the rest of the extension. */
export interface IPanelActions extends IJobActions, ISweepActions {
  runAsJob: () => void;
}

const SPARK_SLOTS = 30;
const SPARK_W = 180;
const SPARK_H = 32;

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
        <div
          className="gpulab-quota-guarantee"
          style={{ left: `${s.guaranteeAt}%` }}
          aria-hidden="true"
        />
      </div>
      <div className="gpulab-quota-legend" aria-hidden="true">
        <span>
          <i className="gpulab-swatch gpulab-quota-in" />
          in quota {formatGPUs(team.in_quota_milli)}
        </span>
        <span>
          <i className="gpulab-swatch gpulab-quota-burst" />
          burst {formatGPUs(team.over_quota_milli)}
        </span>
        <span>
          <i className="gpulab-swatch gpulab-quota-free" />
          free {formatGPUs(team.free_milli)}
        </span>
      </div>
      <div className="gpulab-muted gpulab-quota-note">
        Counts every server and job of the team, yours included.
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
      <svg
        width={SPARK_W}
        height={SPARK_H}
        role="img"
        aria-label={label}
        viewBox={`0 0 ${SPARK_W} ${SPARK_H}`}
      >
        <rect x={0} y={0} width={SPARK_W} height={SPARK_H} className="gpulab-spark-bg" />
        <path
          d={sparklinePath(values, SPARK_W, SPARK_H, SPARK_SLOTS)}
          className="gpulab-spark-line"
        />
      </svg>
      <span className="gpulab-spark-now">{last === null ? '–' : `${last}%`}</span>
    </div>
  );
}

function IdleWarning({
  idle,
  now,
  onKeep
}: {
  idle: IIdleState;
  now: number;
  onKeep: () => Promise<void>;
}): JSX.Element | null {
  const [busy, setBusy] = useState(false);
  if (!idle.warning) {
    return null;
  }
  const keep = keepAliveState(idle);
  // At its maximum lifetime nothing extends the server: no button, only why.
  const lifetime = warnedLifetime(idle) !== null;
  return (
    <div className="gpulab-idle" role="alert">
      <div>
        <strong>{lifetime ? 'Maximum lifetime:' : 'Idle GPU:'}</strong> {idle.warning.reason}
      </div>
      {idle.warning.held ? (
        <div className="gpulab-idle-held">
          On hold: no utilisation data right now; nothing is reclaimed until it returns.
        </div>
      ) : (
        <div>
          {lifetime ? 'Stopped, whatever the GPU does,' : 'Reclaimed'} in{' '}
          <span
            className="gpulab-countdown"
            role="timer"
            aria-label="time until the GPU is reclaimed"
          >
            {formatCountdown(idle.warning.reclaim_at, now)}
          </span>
        </div>
      )}
      {lifetime ? null : (
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
      )}
      <div className="gpulab-muted">{keep.label}</div>
    </div>
  );
}

/** What stopping this server releases, in words ("its GPU share (0.5 × H100-80GB)"). */
export function releasedWords(session: ISession | null): string {
  return session?.gpu && session.share ? `its GPU share (${session.share})` : 'its resources';
}

/** Confirm, then ask the hub to stop this server; the status line says what happens. */
export async function confirmStop(
  model: GpuStatusModel,
  what: string,
  report: (text: string) => void
): Promise<void> {
  const result = await showDialog({
    title: 'Stop this server?',
    body:
      `The hub stops this JupyterLab server and releases ${what}. ` +
      'Running kernels end and unsaved changes are lost; your files stay. You can start again from the hub.',
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop server' })]
  });
  if (!result.button.accept) {
    return;
  }
  await announceStopRequested(model);
  try {
    const state = await model.requestStop(); // the stop section shows its state from now on
    if (state.state === 'failed') {
      announceStopFailed(model, state.message);
    }
  } catch (e) {
    const text = `Stopping failed: ${message(e)}`;
    announceStopFailed(model, text);
    report(text);
  }
}

/** A section another plugin added (IGpuSidebar.addSection). */
interface IExtraSection {
  id: string;
  render: () => JSX.Element | null;
}

function GPUPanelView({
  model,
  sweeps,
  actions,
  sections = []
}: {
  model: GpuStatusModel;
  sweeps: SweepsModel | null;
  actions: IPanelActions;
  sections?: IExtraSection[];
}): JSX.Element {
  const [status, setStatus] = useState('');
  const { session, me, idle, jobs, errors, hub } = model;
  const now = model.now;
  if (hub !== 'loading' && hub !== 'ok') {
    return (
      <div className="gpulab-panel">
        <header className="gpulab-header">
          <gpuIcon.react tag="span" className="gpulab-header-icon" />
          <h2>GPU</h2>
        </header>
        <p className="gpulab-absent" role="note">
          {absenceSentence(hub)}
        </p>
      </div>
    );
  }
  // The server stopped answering after its warning's reclaim time: the culler took the GPU back.
  const reclaimed = model.lostAt === null ? null : reclaimFromWarning(idle, model.lostAt);
  if (reclaimed) {
    return (
      <div className="gpulab-panel">
        <header className="gpulab-header">
          <gpuIcon.react tag="span" className="gpulab-header-icon" />
          <h2>GPU</h2>
        </header>
        <section className="gpulab-section gpulab-reclaimed" role="alert">
          <h3>This session</h3>
          <p>{reclaimedMessage(reclaimed)}</p>
          <a className="jp-mod-styled jp-mod-accept gpulab-start-again" href={hubHome()}>
            Start again
          </a>
        </section>
      </div>
    );
  }
  const team = sessionTeam(me, session);
  const profile = sessionProfile(me, session);
  const utilReason =
    session === null || session.utilisation.available ? null : session.utilisation.reason;
  const what = releasedWords(session);
  const stop = model.stop;
  return (
    <div className="gpulab-panel">
      <header className="gpulab-header">
        <gpuIcon.react tag="span" className="gpulab-header-icon" />
        <h2>GPU</h2>
      </header>
      <section className="gpulab-section" aria-labelledby="gpulab-session-h">
        <h3 id="gpulab-session-h">This session</h3>
        {errors.session && (
          <div className="gpulab-error" role="alert">
            This server did not answer: {errors.session}
          </div>
        )}
        {session === null ? (
          <div className="gpulab-muted gpulab-placeholder">Loading…</div>
        ) : !session.gpu ? (
          <div className="gpulab-muted">This server has no GPU.</div>
        ) : (
          <dl className="gpulab-facts">
            <dt>Profile</dt>
            <dd className="gpulab-profile" title={session.profile ?? ''}>
              {profile?.display_name ?? session.profile}
            </dd>
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
        {session?.gpu && <Sparkline values={model.history} reason={utilReason} />}
        {session?.gpu && profile?.idle_policy && (
          <p className="gpulab-idle-policy">
            <strong>Idle policy:</strong> {profile.idle_policy}.
          </p>
        )}
        {session?.gpu && profile?.right_size && (
          <p className="gpulab-right-size" role="note">
            {profile.right_size}. Pick it next time on the spawn page.
          </p>
        )}
        {session?.gpu && reclaimOffText(idle) && (
          <p className="gpulab-idle-off" role="note">
            {reclaimOffText(idle)}
          </p>
        )}
        {idle && session && (
          <IdleWarning
            idle={idle}
            now={now}
            onKeep={async () => {
              try {
                await model.keep();
                setStatus('Your GPU is kept.');
              } catch (e) {
                setStatus(`Keep my GPU failed: ${message(e)}`);
              }
            }}
          />
        )}
        {session?.hub && (
          <div className="gpulab-stop">
            <button
              className="jp-mod-styled jp-mod-warn gpulab-stop-button"
              disabled={stop?.state === 'requested' || stop?.state === 'stopping'}
              onClick={() => void confirmStop(model, what, setStatus)}
            >
              {session.gpu ? 'Stop server and release GPU' : 'Stop server'}
            </button>
            {stop && (
              <div
                className={stop.state === 'failed' ? 'gpulab-error' : 'gpulab-muted'}
                role="status"
              >
                {stop.message}
              </div>
            )}
          </div>
        )}
        {errors.me && (
          <div className="gpulab-error" role="alert">
            Quota: {errors.me}
          </div>
        )}
        {team ? (
          <QuotaBar team={team} />
        ) : (
          !errors.me && <div className="gpulab-quota gpulab-placeholder" />
        )}
      </section>
      {sections.map(section => (
        <React.Fragment key={section.id}>{section.render()}</React.Fragment>
      ))}
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
        <JobsList
          jobs={jobs}
          error={errors.jobs}
          now={now}
          actions={actions}
          report={setStatus}
          reload={() => model.refresh()}
        />
      </section>
      {sweeps && (
        // Its own subscription: a sweep's news re-render the sweeps, not the panel (its jobs list).
        <UseSignal signal={sweeps.changed}>
          {() => <SweepsSection model={sweeps} actions={actions} report={setStatus} />}
        </UseSignal>
      )}
    </div>
  );
}

/** The sidebar widget: re-rendered whenever the model changes (and each second of a countdown). */
export class GPUPanel extends ReactWidget implements IGpuSidebar {
  constructor(
    private readonly _model: GpuStatusModel,
    private readonly _actions: IPanelActions,
    private readonly _sweeps: SweepsModel | null = null
  ) {
    super();
    this.id = 'gpulab-panel';
    this.addClass('gpulab-panel-widget');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU: session, quota and jobs';
    _model.changed.connect(this.update, this);
    _model.ticked.connect(this.update, this);
  }

  addSection(id: string, render: () => JSX.Element | null, changed: ISignal<unknown, void>): void {
    this._sections = [...this._sections.filter(s => s.id !== id), { id, render }];
    changed.connect(this.update, this);
    this.update();
  }

  render(): JSX.Element {
    return (
      <GPUPanelView
        model={this._model}
        sweeps={this._sweeps}
        actions={this._actions}
        sections={this._sections}
      />
    );
  }

  private _sections: IExtraSection[] = [];
}
