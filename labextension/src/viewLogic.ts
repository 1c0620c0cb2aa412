/**
 * Pure helpers of the sidebar and the job dialog that read the hub's view
 * (no DOM, no network; tested in test/viewLogic.test.ts): the session's
 * profile by name, the idle policy in words, which profiles a job class may
 * use, the dialog's default profile, and a job's times and history.
 */
import { formatDuration, formatGPUs } from './logic';
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

/** "30 min", "2 h", "1 h 30 min". */
export function formatTimeout(seconds: number): string {
  const m = Math.round(seconds / 60);
  if (m < 60) {
    return `${m} min`;
  }
  const h = Math.floor(m / 60);
  return m % 60 ? `${h} h ${m % 60} min` : `${h} h`;
}

/** Why the GPU idle culler cannot reclaim this session, or `null` when it can. */
export function reclaimOffText(idle: Pick<IIdleState, 'reclaim_off'> | null): string | null {
  const off = idle?.reclaim_off;
  return off ? `Idle GPU reclaim is off for this server: ${off.reason}` : null;
}

/** What the GPU idle culler will do to this session, in one sentence. */
export function idlePolicyText(
  profile: IProfileChoice | undefined,
  keepaliveSeconds: number | null
): string {
  const timeout = profile?.idle_timeout_seconds;
  const when =
    typeof timeout === 'number'
      ? `If the GPU stays idle for ${formatTimeout(timeout)}`
      : "If the GPU stays idle for the culler's default timeout";
  const keep = keepaliveSeconds
    ? ` or press “Keep my GPU” (${formatDuration(keepaliveSeconds)} more)`
    : '';
  return `${when}, you get a warning; unless you use it${keep}, the server is then stopped and the GPU released.`;
}

/** Whether a job of `jobClass` may use `profile` now; the profile's own view when the hub is older. */
export function offerFor(
  profile: IProfileChoice,
  jobClass: JobClass
): { available: boolean; overQuota: boolean; reason: string } {
  const offer = profile.job_classes?.[jobClass];
  if (offer) {
    return { available: offer.available, overQuota: offer.over_quota, reason: offer.reason };
  }
  return { available: profile.available, overQuota: profile.over_quota, reason: profile.reason };
}

/** The profile's line in the dialog's list: size and what a job of this class would get. */
export function offerLabel(profile: IProfileChoice, jobClass: JobClass): string {
  const o = offerFor(profile, jobClass);
  const state = o.available
    ? o.overQuota
      ? 'available above the guarantee (preemptible)'
      : 'available'
    : `not now: ${o.reason}`;
  return `${profile.display_name} (${formatGPUs(profile.gpu_milli)} GPU) — ${state}`;
}

/**
 * The profile the dialog starts with: the last one used for a job (if it is
 * still offered in the team), else the session's own profile, else the
 * first profile a job of this class may use now. Never "nothing" when the
 * team has profiles.
 */
export function defaultProfile(
  team: ITeamView | undefined,
  jobClass: JobClass,
  lastUsed: string | null,
  sessionProfileSlug: string | null
): string {
  const profiles = team?.profiles ?? [];
  for (const slug of [lastUsed, sessionProfileSlug]) {
    if (slug && profiles.some(p => p.slug === slug)) {
      return slug;
    }
  }
  const gpu = profiles.filter(p => p.gpu_milli > 0);
  const pick =
    gpu.find(p => offerFor(p, jobClass).available) ??
    profiles.find(p => offerFor(p, jobClass).available) ??
    gpu[0] ??
    profiles[0];
  return pick?.slug ?? '';
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
