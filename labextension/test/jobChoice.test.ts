import { describe, expect, it } from 'vitest';

import { anyProfile, choiceStatus, initialProfile, profileOptionLabel } from '../src/jobChoice';
import { IMe, ITeamView } from '../src/types';
import { profileChoice as profile } from './fakeClient';

const GUARANTEE_FULL =
  'team vision holds 0.5 of its 0.5 GPU guarantee; this work is never admitted over quota and needs 1';
const WHAT_TO_DO =
  'Start 0.25 × H100, which fits now, stop your default server, which holds 0.5 GPU of team vision’s GPUs, or ask an admin about team vision’s quota.';

/** 1 × H100 fits a batch job (above the guarantee) but not a training job. */
const burstOnly = profile('h100-1', 1000, {
  display_name: '1 × H100',
  over_quota: true,
  job_classes: {
    batch: { available: true, over_quota: true, reason: '', todo: '' },
    training: { available: false, over_quota: false, reason: GUARANTEE_FULL, todo: WHAT_TO_DO }
  }
});
/** Nothing fits 2 × H100 now. */
const tooBig = profile('h100-2', 2000, {
  display_name: '2 × H100',
  available: false,
  reason: 'no free H100-80GB on this server fits 2 GPU',
  job_classes: {
    batch: {
      available: false,
      over_quota: false,
      reason: 'no free H100-80GB fits 2 GPU',
      todo: 'Ask.'
    },
    training: {
      available: false,
      over_quota: false,
      reason: 'no free H100-80GB fits 2 GPU',
      todo: 'Ask.'
    }
  }
});
const quarter = profile('h100-quarter', 250, { display_name: '0.25 × H100' });

const vision: ITeamView = {
  name: 'vision',
  display_name: 'Vision',
  guarantee_milli: 500,
  burst_milli: 2000,
  per_user_cap_milli: null,
  held_milli: 500,
  in_quota_milli: 500,
  over_quota_milli: 0,
  free_milli: 1500,
  user_held_milli: 500,
  summary: '',
  profiles: [profile('cpu', 0), tooBig, burstOnly, quarter]
};
const nlp: ITeamView = { ...vision, name: 'nlp', display_name: 'NLP', profiles: [quarter] };
const me: IMe = { user: 'alice', teams: [vision, nlp], holdings: [] };

describe('the dialog keeps the choice and says when it stops fitting', () => {
  it('keeps 1 × H100 when the class becomes training, with the reason, what to do, and batch instead', () => {
    expect(choiceStatus(vision, 'h100-1', 'batch')).toEqual({
      fits: true,
      overQuota: true,
      reason: '',
      todo: '',
      batchFits: false
    });
    expect(choiceStatus(vision, 'h100-1', 'training')).toEqual({
      fits: false,
      overQuota: false,
      reason: GUARANTEE_FULL,
      todo: WHAT_TO_DO,
      batchFits: true
    });
  });
  it('offers no batch instead when batch does not fit either', () => {
    const s = choiceStatus(vision, 'h100-2', 'training');
    expect(s.fits).toBe(false);
    expect(s.batchFits).toBe(false);
    expect(s.todo).toBe('Ask.');
  });
  it('says a team does not offer the chosen profile, and keeps its name', () => {
    const s = choiceStatus(nlp, 'h100-1', 'batch');
    expect(s).toMatchObject({ fits: false, reason: 'team nlp does not offer this profile' });
    expect(anyProfile(me, 'h100-1')?.display_name).toBe('1 × H100');
    expect(profileOptionLabel(burstOnly, 'batch', nlp)).toBe(
      '1 × H100 (1 GPU) — not offered to team nlp'
    );
  });
  it('asks for a profile when none is chosen', () => {
    expect(choiceStatus(vision, '', 'batch')).toMatchObject({
      fits: false,
      reason: 'Choose a GPU profile.'
    });
    expect(choiceStatus(undefined, 'h100-1', 'batch').fits).toBe(false);
  });
  it('labels each profile with what a job of the class would get', () => {
    expect(profileOptionLabel(burstOnly, 'batch', vision)).toBe(
      '1 × H100 (1 GPU) — available above the guarantee (preemptible)'
    );
    expect(profileOptionLabel(burstOnly, 'training', vision)).toBe(
      `1 × H100 (1 GPU) — not now: ${GUARANTEE_FULL}`
    );
    expect(profileOptionLabel(quarter, 'training', vision)).toBe(
      '0.25 × H100 (0.25 GPU) — available'
    );
  });
});

describe('the dialog preselects nothing that would be refused', () => {
  it('starts from the last used profile, then the session profile, when they fit', () => {
    expect(initialProfile(vision, 'batch', 'h100-1', 'h100-quarter')).toBe('h100-1');
    expect(initialProfile(vision, 'batch', 'retired', 'h100-quarter')).toBe('h100-quarter');
  });
  it('skips a remembered profile that does not fit now', () => {
    expect(initialProfile(vision, 'batch', 'h100-2', null)).toBe('h100-1'); // the first GPU profile that fits
    expect(initialProfile(vision, 'training', 'h100-1', null)).toBe('h100-quarter');
  });
  it('prefers a GPU profile, and chooses nothing when nothing fits', () => {
    expect(initialProfile(vision, 'batch', null, null)).toBe('h100-1');
    const full: ITeamView = { ...vision, profiles: [tooBig] };
    expect(initialProfile(full, 'batch', 'h100-2', 'h100-2')).toBe('');
    expect(initialProfile(undefined, 'batch', null, null)).toBe('');
  });
});
