import { describe, expect, it } from 'vitest';

import { IMe, ITeamView } from '../src/types';
import { jobHistory, reclaimOffText, sessionProfile, shortTime } from '../src/viewLogic';
import { job, profileChoice as profile, SESSION } from './fakeClient';

const burstOnly = profile('h100-1', 1000, {
  over_quota: true,
  job_classes: {
    batch: { available: true, over_quota: true, reason: '' },
    training: {
      available: false,
      over_quota: false,
      reason:
        'team vision holds 0.25 of its 0.5 GPU guarantee; this work is never admitted over quota and needs 1'
    }
  }
});

const team: ITeamView = {
  name: 'vision',
  display_name: 'Vision',
  guarantee_milli: 500,
  burst_milli: 2000,
  per_user_cap_milli: null,
  held_milli: 250,
  in_quota_milli: 250,
  over_quota_milli: 0,
  free_milli: 1750,
  user_held_milli: 250,
  summary: '',
  profiles: [
    profile('cpu', 0),
    burstOnly,
    profile('h100-half', 500, { display_name: '0.5 × H100', idle_timeout_seconds: 1800 })
  ]
};

describe('the session', () => {
  it('names the session profile as the catalog does', () => {
    const me: IMe = { user: 'alice', teams: [team], holdings: [] };
    expect(sessionProfile(me, SESSION)?.display_name).toBe('0.5 × H100');
    expect(sessionProfile(me, { ...SESSION, profile: 'gone' })).toBeUndefined();
  });
});

describe('the jobs list', () => {
  it('shows times of today without the date, and the state history', () => {
    const now = Date.parse('2026-11-30T15:00:00Z');
    expect(shortTime('2026-11-30T14:05:09Z', now, 'UTC')).toBe('14:05');
    expect(shortTime('2026-11-29T14:05:09Z', now, 'UTC')).toBe('29 Nov 14:05');
    expect(shortTime(null, now, 'UTC')).toBe('–');
    const j = {
      ...job(7, 'running'),
      history: [
        {
          state: 'queued' as const,
          at: '2026-11-30T14:00:00Z',
          reason: 'admitted within the team guarantee'
        },
        { state: 'running' as const, at: '2026-11-30T14:01:00Z', reason: null }
      ]
    };
    expect(jobHistory(j, now, 'UTC')).toEqual([
      { state: 'queued', at: '14:00', reason: 'admitted within the team guarantee' },
      { state: 'running', at: '14:01', reason: '' }
    ]);
  });
});

describe('reclaimOffText', () => {
  it('says why the idle culler cannot reclaim this server, and nothing when it can', () => {
    const reason = "KAI holds this GPU fraction's GPU with its gpu-reservation pod";
    expect(
      reclaimOffText({
        reclaim_off: { code: 'kai-reservation-pod', reason, since: '2026-12-01T10:00:00Z' }
      })
    ).toBe(`Idle GPU reclaim is off for this server: ${reason}`);
    expect(reclaimOffText({ reclaim_off: null })).toBeNull();
    expect(reclaimOffText({})).toBeNull();
    expect(reclaimOffText(null)).toBeNull();
  });
});
