/**
 * Pure helpers of the sidebar and the job dialog that read the hub's view
 * (no DOM, no network; tested in test/viewLogic.test.ts): the session's
 * profile by name, which profiles a job class may use, and a job's times and
 * history.
 */
import { IIdleState, IJob, IMe, IProfileChoice, ISession, ITeamView, JobClass } from './types';

/** The team the session's quota bar shows: the session's, else the user's first. */
export function sessionTeam(me: IMe | null, session: ISession | null): ITeamView | undefined {
  if (!me) {
    return undefined;
  }
  return (session?.team ? me.teams.find(t => t.name === session.team) : undefined) ?? me.teams[0];
}

/** The session's profile as the catalog names it ("0.5 × H100"), if the hub lists it. */
export function sessionProfile(
  me: IMe | null,
  session: ISession | null
): IProfileChoice | undefined {
  if (!me || !session?.profile) {
    return undefined;
  }
  const teams = session.team ? me.teams.filter(t => t.name === session.team) : me.teams;
  for (const t of teams) {
    const p = t.profiles.find(x => x.slug === session.profile);
    if (p) {
      return p;
    }
  }
  return undefined;
}

/** Why the GPU idle culler cannot reclaim this session, or `null` when it can. */
export function reclaimOffText(idle: Pick<IIdleState, 'reclaim_off'> | null): string | null {
  const off = idle?.reclaim_off;
  return off ? `Idle GPU reclaim is off for this server: ${off.reason}` : null;
}

/** Whether a job of `jobClass` may use `profile` now; the profile's own view when the hub is older. */
export function offerFor(
  profile: IProfileChoice,
  jobClass: JobClass
): { available: boolean; overQuota: boolean; reason: string; todo: string } {
  const offer = profile.job_classes?.[jobClass];
  if (offer) {
    return {
      available: offer.available,
      overQuota: offer.over_quota,
      reason: offer.reason,
      todo: offer.todo ?? ''
    };
  }
  return {
    available: profile.available,
    overQuota: profile.over_quota,
    reason: profile.reason,
    todo: ''
  };
}

/** "14:05" (today) or "30 Nov 14:05", in the user's time zone (or `timeZone`). */
export function shortTime(iso: string | null, now: number, timeZone?: string): string {
  if (!iso) {
    return '–';
  }
  const t = Date.parse(iso);
  const d = new Date(t);
  const time = d.toLocaleTimeString('en-GB', {
    hour: '2-digit',
    minute: '2-digit',
    hour12: false,
    timeZone
  });
  const day = (x: number) => new Date(x).toLocaleDateString('en-GB', { timeZone });
  if (day(t) === day(now)) {
    return time;
  }
  return `${d.toLocaleDateString('en-GB', { day: 'numeric', month: 'short', timeZone })} ${time}`;
}

/** The job's state history, oldest first: state, when, and why. */
export function jobHistory(
  job: IJob,
  now: number,
  timeZone?: string
): { state: string; at: string; reason: string }[] {
  return (job.history ?? []).map(h => ({
    state: h.state,
    at: shortTime(h.at, now, timeZone),
    reason: h.reason ?? ''
  }));
}
