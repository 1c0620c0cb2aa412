/**
 * What the user is told about the GPU idle culler: pure functions of the
 * hub's idle state and the clock (tested in test/idle.test.ts).
 */
import { IIdleState } from './types';

/** A reclaim as the user is told about it. */
export interface IReclaimInfo {
  /** When the GPU was reclaimed (ms since the epoch). */
  at: number;
  /** How long the GPU sat at (or below) the threshold before the reclaim, in minutes. */
  idleMinutes: number | null;
  /** The highest utilisation seen over that time, in percent. */
  peakPercent: number;
}

/** A wait in whole minutes, rounded up ("less than a minute" below one). */
export function minutesLeft(seconds: number): string {
  return seconds <= 0
    ? 'now'
    : seconds < 60
      ? 'less than a minute'
      : `${Math.ceil(seconds / 60)} min`;
}

/** Hours and minutes of `ms` on the user's clock (or in `timeZone`). */
export function clockTime(ms: number, timeZone?: string): string {
  return new Date(ms).toLocaleTimeString('en-GB', {
    hour: '2-digit',
    minute: '2-digit',
    hour12: false,
    timeZone
  });
}

function evidenceNumber(evidence: Record<string, unknown>, key: string): number | null {
  const v = evidence[key];
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

/** The highest per-device peak in the warning's evidence (0 when none is recorded). */
export function evidencePeak(evidence: Record<string, unknown>): number {
  const devices = evidence.devices;
  let peak = 0;
  if (devices && typeof devices === 'object') {
    for (const series of Object.values(devices as Record<string, unknown>)) {
      for (const s of Array.isArray(series) ? series : []) {
        const m = (s as { max?: unknown }).max;
        if (typeof m === 'number' && m > peak) {
          peak = m;
        }
      }
    }
  }
  return peak;
}

/** The warning as a notification: text and kind, or `null` when there is nothing to say. */
export function idleNotice(
  idle: IIdleState | null,
  now: number,
  timeZone?: string
): { message: string; reclaimAt: number | null; held: boolean } | null {
  const w = idle?.warning;
  if (!w) {
    return null;
  }
  if (w.held) {
    return {
      message:
        'Your GPU was idle and is on notice, but its utilisation data is missing right now. ' +
        'Nothing is reclaimed without data: a new reclaim time, with a new grace period, is announced when data returns.',
      reclaimAt: null,
      held: true
    };
  }
  const reclaimAt = Date.parse(w.reclaim_at);
  const timeout = evidenceNumber(w.evidence, 'idle_timeout_seconds');
  const idleFor = timeout === null ? '' : ` for ${Math.round(timeout / 60)} minutes`;
  const left = Math.max(0, Math.round((reclaimAt - now) / 1000));
  return {
    message:
      `Your GPU has been at ${evidencePeak(w.evidence)} %${idleFor}. It will be reclaimed at ` +
      `${clockTime(reclaimAt, timeZone)} (${left > 0 ? 'in ' : ''}${minutesLeft(left)}) unless you use it or press "Keep my GPU".`,
    reclaimAt,
    held: false
  };
}

/** The status bar's text ('' hides the item). */
export function idleStatusText(idle: IIdleState | null, now: number, timeZone?: string): string {
  const w = idle?.warning;
  if (!w) {
    return '';
  }
  if (w.held) {
    return 'GPU idle: on hold (no data)';
  }
  const reclaimAt = Date.parse(w.reclaim_at);
  const left = Math.max(0, Math.round((reclaimAt - now) / 1000));
  return `GPU idle: reclaimed at ${clockTime(reclaimAt, timeZone)} (${left > 0 ? 'in ' : ''}${minutesLeft(left)})`;
}

/**
 * When the lab loses its server: was it the culler? Yes when the last state
 * seen held a warning whose grace was over (not on hold, not kept alive).
 */
export function reclaimFromWarning(idle: IIdleState | null, lostAt: number): IReclaimInfo | null {
  const w = idle?.warning;
  if (!w || w.held) {
    return null;
  }
  const reclaimAt = Date.parse(w.reclaim_at);
  const keptUntil = idle?.keepalive.until ? Date.parse(idle.keepalive.until) : 0;
  if (!Number.isFinite(reclaimAt) || lostAt < reclaimAt || keptUntil > lostAt) {
    return null;
  }
  const timeout = evidenceNumber(w.evidence, 'idle_timeout_seconds');
  const idleSince = timeout === null ? null : Date.parse(w.warned_at) - timeout * 1000;
  return {
    at: lostAt,
    idleMinutes: idleSince === null ? null : Math.round((lostAt - idleSince) / 60000),
    peakPercent: evidencePeak(w.evidence)
  };
}

/** "Your GPU was reclaimed at HH:MM after N minutes at 0 % — start again." */
export function reclaimedMessage(info: IReclaimInfo, timeZone?: string): string {
  const after =
    info.idleMinutes === null ? '' : ` after ${info.idleMinutes} minutes at ${info.peakPercent} %`;
  return `Your GPU was reclaimed at ${clockTime(info.at, timeZone)}${after} — start again when you need it.`;
}
