import { describe, expect, it } from 'vitest';

import {
  clockTime,
  minutesLeft,
  evidencePeak,
  idleNotice,
  idleStatusText,
  lifetimeWords,
  reclaimedMessage,
  reclaimFromWarning
} from '../src/idleLogic';
import { keepAliveState } from '../src/logic';
import { IIdleState } from '../src/types';

const T0 = Date.parse('2026-11-30T14:00:00Z');

function state(
  overrides: Partial<NonNullable<IIdleState['warning']>> | null,
  keptUntil: string | null = null
): IIdleState {
  return {
    user: 'alice',
    server: '',
    session: '2026-11-30T12:00:00.000000Z',
    warning:
      overrides === null
        ? null
        : {
            warned_at: '2026-11-30T14:00:00Z',
            reclaim_at: '2026-11-30T14:15:00Z',
            reason: 'every sample of 1 GPU(s) at or below 1% for 60m',
            evidence: {
              idle_timeout_seconds: 3600,
              devices: { 'node/gpu0': [{ max: 0 }, { max: 0.5 }] }
            },
            ...overrides
          },
    keepalive: { used: 0, max: 2, extends_seconds: 3600, until: keptUntil }
  };
}

describe('idle notice', () => {
  it('says when the GPU will be reclaimed, how long until then, and how idle it was', () => {
    const n = idleNotice(state({}), T0 + 5 * 60 * 1000, 'UTC');
    expect(n?.held).toBe(false);
    expect(n?.reclaimAt).toBe(Date.parse('2026-11-30T14:15:00Z'));
    expect(n?.message).toContain('reclaimed at 14:15');
    expect(n?.message).toContain('(in 10 min)');
    expect(n?.message).toContain('at 0.5 % for 60 minutes');
    expect(n?.message).toContain('Keep my GPU');
  });

  it('never counts below zero and says nothing without a warning', () => {
    expect(idleNotice(state({}), T0 + 3600 * 1000, 'UTC')?.message).toContain('(now)');
    expect(idleNotice(state(null), T0)).toBeNull();
    expect(idleNotice(null, T0)).toBeNull();
    expect(idleStatusText(state(null), T0)).toBe('');
  });

  it('explains a warning on hold instead of counting down', () => {
    const n = idleNotice(state({ held: true }), T0);
    expect(n?.held).toBe(true);
    expect(n?.reclaimAt).toBeNull();
    expect(n?.message).toContain('Nothing is reclaimed without data');
    expect(idleStatusText(state({ held: true }), T0)).toContain('on hold');
  });

  it('puts the reclaim time and what is left in the status bar', () => {
    expect(idleStatusText(state({}), T0 + 60 * 1000, 'UTC')).toBe(
      'GPU idle: reclaimed at 14:15 (in 14 min)'
    );
  });
});

describe('reclaim explained', () => {
  it('is the culler when the connection is lost after the grace ended', () => {
    const lost = Date.parse('2026-11-30T14:16:00Z');
    const info = reclaimFromWarning(state({}), lost);
    // Idle since 13:00 (warned at 14:00 after a 60 min timeout): 76 minutes at 14:16.
    expect(info).toEqual({ at: lost, idleMinutes: 76, peakPercent: 0.5 });
    expect(reclaimedMessage(info!, 'UTC')).toBe(
      'Your GPU was reclaimed at 14:16 after 76 minutes at 0.5 % — start again when you need it.'
    );
  });

  it('is not the culler before the grace ended, while on hold, or while kept', () => {
    expect(reclaimFromWarning(state({}), Date.parse('2026-11-30T14:10:00Z'))).toBeNull();
    expect(
      reclaimFromWarning(state({ held: true }), Date.parse('2026-11-30T15:00:00Z'))
    ).toBeNull();
    expect(
      reclaimFromWarning(state({}, '2026-11-30T16:00:00Z'), Date.parse('2026-11-30T14:20:00Z'))
    ).toBeNull();
    expect(reclaimFromWarning(state(null), Date.parse('2026-11-30T15:00:00Z'))).toBeNull();
  });

  it('leaves the minutes out when the evidence has no timeout', () => {
    const info = reclaimFromWarning(state({ evidence: {} }), Date.parse('2026-11-30T14:20:00Z'));
    expect(info?.idleMinutes).toBeNull();
    expect(reclaimedMessage(info!, 'UTC')).toBe(
      'Your GPU was reclaimed at 14:20 — start again when you need it.'
    );
  });
});

describe('helpers', () => {
  it('formats a 24 h clock and finds the evidence peak', () => {
    expect(clockTime(Date.parse('2026-11-30T09:05:00Z'), 'UTC')).toBe('09:05');
    expect(evidencePeak({ devices: { a: [{ max: 0.2 }], b: [{ max: 0.7 }, { nope: 1 }] } })).toBe(
      0.7
    );
    expect(evidencePeak({})).toBe(0);
    expect([minutesLeft(0), minutesLeft(30), minutesLeft(61)]).toEqual([
      'now',
      'less than a minute',
      '2 min'
    ]);
  });
});

describe('maximum lifetime', () => {
  const lifetime = {
    reason: 'maximum lifetime 8h of profile h100-4 reached',
    evidence: {
      max_lifetime_seconds: 8 * 3600,
      max_lifetime_from: 'profile h100-4',
      session_started_at: 0,
      lifetime_ends_at: 0
    }
  };
  it('says the warning is the lifetime, not idleness, and offers no "Keep my GPU"', () => {
    const notice = idleNotice(state(lifetime), T0 + 5 * 60000, 'UTC');
    expect(notice?.message).toBe(
      'This server reached its maximum lifetime of 8 h. It will be stopped at 14:15 (in 10 min) whatever ' +
        'its GPU does; "Keep my GPU" cannot extend it. Save your work.'
    );
    expect(notice?.lifetime).toBe(true);
    expect(idleStatusText(state(lifetime), T0, 'UTC')).toBe(
      'GPU lifetime reached: reclaimed at 14:15 (in 15 min)'
    );
    expect(keepAliveState(state(lifetime))).toEqual({
      enabled: false,
      label: 'Maximum lifetime reached: "Keep my GPU" cannot extend it'
    });
    expect(idleNotice(state({}), T0, 'UTC')?.lifetime).toBeUndefined();
    expect(keepAliveState(state({})).enabled).toBe(true);
  });
  it('explains a lost connection after the grace as the lifetime', () => {
    const info = reclaimFromWarning(state(lifetime), Date.parse('2026-11-30T14:16:00Z'));
    expect(info?.idleMinutes).toBeNull();
    expect(reclaimedMessage(info!, 'UTC')).toBe(
      'Your GPU was reclaimed at 14:16: the session reached its maximum lifetime of 8 h — start again when you need it.'
    );
    expect(lifetimeWords(5400)).toBe('1 h 30 min');
    expect(lifetimeWords(86400 + 60)).toBe('1 d 1 min');
  });
});
