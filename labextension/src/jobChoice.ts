/**
 * The job dialog's choices, as pure functions (tested in test/jobChoice.test.ts):
 * which profile it starts with, whether the chosen team, class and profile fit
 * now (and if not, why and what to do, in the spawn page's words from the hub).
 * The dialog never changes a choice the user
 * made: it only says when that choice stops fitting.
 */
import { formatGPUs } from './logic';
import { IMe, IProfileChoice, ITeamView, JobClass } from './types';
import { offerFor } from './viewLogic';

/** Whether the chosen team, class and profile may be submitted now, and if not, why. */
export interface IChoiceStatus {
  /** Submit may send it. */
  fits: boolean;
  /** It would run above the team guarantee (preemptible). */
  overQuota: boolean;
  /** Why it does not fit ('' when it fits). */
  reason: string;
  /** What to do about it (the hub's sentence; '' when it fits or the hub has none). */
  todo: string;
  /** A training job that does not fit would run now as a batch job (preemptible). */
  batchFits: boolean;
}

/** The profile called `slug` in any of the user's teams (its name, when the chosen team lacks it). */
export function anyProfile(me: IMe, slug: string): IProfileChoice | undefined {
  for (const t of me.teams) {
    const p = t.profiles.find(x => x.slug === slug);
    if (p) {
      return p;
    }
  }
  return undefined;
}

export function choiceStatus(
  team: ITeamView | undefined,
  slug: string,
  jobClass: JobClass
): IChoiceStatus {
  const no = { fits: false, overQuota: false, batchFits: false, todo: '' };
  if (!team) {
    return { ...no, reason: 'You are not in any gpulab team, so you cannot run GPU jobs.' };
  }
  if (!slug) {
    return { ...no, reason: 'Choose a GPU profile.' };
  }
  const profile = team.profiles.find(p => p.slug === slug);
  if (!profile) {
    return {
      ...no,
      reason: `team ${team.name} does not offer this profile`,
      todo: 'Choose one of its profiles, or the team that offers this one.'
    };
  }
  const offer = offerFor(profile, jobClass);
  if (offer.available) {
    return { ...no, fits: true, overQuota: offer.overQuota, reason: '' };
  }
  return {
    ...no,
    reason: offer.reason,
    todo: offer.todo,
    batchFits: jobClass === 'training' && offerFor(profile, 'batch').available
  };
}

/**
 * The profile the dialog starts with: the last one used for a job, else the
 * session's own, when a job of this class may use it now; else the first GPU
 * profile (then any profile) that it may use now; else none (''). Never one
 * that would be refused.
 */
export function initialProfile(
  team: ITeamView | undefined,
  jobClass: JobClass,
  lastUsed: string | null,
  sessionProfileSlug: string | null
): string {
  const profiles = team?.profiles ?? [];
  const fits = (p: IProfileChoice) => offerFor(p, jobClass).available;
  for (const slug of [lastUsed, sessionProfileSlug]) {
    const p = slug ? profiles.find(x => x.slug === slug) : undefined;
    if (p && fits(p)) {
      return p.slug;
    }
  }
  const pick = profiles.find(p => p.gpu_milli > 0 && fits(p)) ?? profiles.find(fits);
  return pick?.slug ?? '';
}

/** A profile's line in the dialog's list: its size and what a job of this class would get now. */
export function profileOptionLabel(
  profile: IProfileChoice,
  jobClass: JobClass,
  team: ITeamView | undefined
): string {
  const size = `${profile.display_name} (${formatGPUs(profile.gpu_milli)} GPU)`;
  if (team && !team.profiles.some(p => p.slug === profile.slug)) {
    return `${size} — not offered to team ${team.name}`;
  }
  const o = offerFor(profile, jobClass);
  const state = o.available
    ? o.overQuota
      ? 'available above the guarantee (preemptible)'
      : 'available'
    : `not now: ${o.reason}`;
  return `${size} — ${state}`;
}
