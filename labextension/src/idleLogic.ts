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
  /** Set when the server was stopped for its age (its maximum lifetime, in seconds), not idleness. */
  lifetimeSeconds?: number | null;
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

/**
 * The maximum lifetime of the warned session, in seconds, when that is why it is warned
 * (the culler's evidence says `max_lifetime_seconds`), else `null`: idleness.
 */
export function warnedLifetime(idle: IIdleState | null): number | null {
  const w = idle?.warning;
  return w ? evidenceNumber(w.evidence, 'max_lifetime_seconds') : null;
}

/** `28800` -> `"8 h"`, `5400` -> `"1 h 30 min"`, `90` -> `"1 min 30 s"`. */
export function lifetimeWords(seconds: number): string {
  const units: [number, string][] = [
    [86400, 'd'],
    [3600, 'h'],
    [60, 'min'],
    [1, 's']
  ];
  const parts: string[] = [];
  let left = Math.round(seconds);
  for (const [size, name] of units) {
    if (left >= size) {
      parts.push(`${Math.floor(left / size)} ${name}`);
      left %= size;
    }
  }
  return parts.join(' ') || '0 s';
}

/** The warning as a notification: text and kind, or `null` when there is nothing to say. */
export function idleNotice(
  idle: IIdleState | null,
  now: number,
  timeZone?: string
): { message: string; reclaimAt: number | null; held: boolean; lifetime?: boolean } | null {
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
  const lifetime = warnedLifetime(idle);
  if (lifetime !== null) {
    const left = Math.max(0, Math.round((reclaimAt - now) / 1000));
    return {
      message:
        `This server reached its maximum lifetime of ${lifetimeWords(lifetime)}. It will be stopped at ` +
        `${clockTime(reclaimAt, timeZone)} (${left > 0 ? 'in ' : ''}${minutesLeft(left)}) whatever its GPU does; ` +
        '"Keep my GPU" cannot extend it. Save your work.',
      reclaimAt,
      held: false,
      lifetime: true
    };
  }
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
  const what = warnedLifetime(idle ?? null) === null ? 'GPU idle' : 'GPU lifetime reached';
  return `${what}: reclaimed at ${clockTime(reclaimAt, timeZone)} (${left > 0 ? 'in ' : ''}${minutesLeft(left)})`;
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
  const lifetime = warnedLifetime(idle);
  if (lifetime !== null) {
    return {
      at: lostAt,
      idleMinutes: null,
      peakPercent: evidencePeak(w.evidence),
      lifetimeSeconds: lifetime
    };
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
  if (info.lifetimeSeconds) {
    return (
      `Your GPU was reclaimed at ${clockTime(info.at, timeZone)}: the session reached its maximum lifetime ` +
      `of ${lifetimeWords(info.lifetimeSeconds)} — start again when you need it.`
    );
  }
  const after =
    info.idleMinutes === null ? '' : ` after ${info.idleMinutes} minutes at ${info.peakPercent} %`;
  return `Your GPU was reclaimed at ${clockTime(info.at, timeZone)}${after} — start again when you need it.`;
}
