import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { GpuStatusModel } from '../src/model';
import { FakeClient, hubDown, job, noGpulab } from './fakeClient';

const INTERVAL = 1000;
const MAX = 60000; // Lumino's Poll never caps below 30 s

function gaps(times: number[]): number[] {
  return times.slice(1).map((t, i) => t - times[i]);
}

describe('GpuStatusModel: one Lumino Poll for every view', () => {
  let client: FakeClient;
  let model: GpuStatusModel;

  beforeEach(() => {
    vi.useFakeTimers();
    client = new FakeClient();
    model = new GpuStatusModel({ client, interval: INTERVAL, maxInterval: MAX, slowEvery: 3 });
  });
  afterEach(() => {
    model.dispose();
    vi.restoreAllMocks();
    vi.useRealTimers();
  });

  it('asks everything on the first tick and signals each part', async () => {
    const seen: string[] = [];
    model.sessionChanged.connect(() => seen.push('session'));
    model.quotaChanged.connect(() => seen.push('quota'));
    model.jobsChanged.connect(() => seen.push('jobs'));
    model.idleChanged.connect(() => seen.push('idle'));
    await vi.advanceTimersByTimeAsync(10);
    expect(['session', 'jobs', 'me', 'idle'].map(p => client.count(p))).toEqual([1, 1, 1, 1]);
    expect(seen).toEqual(['session', 'jobs', 'quota', 'idle']);
    expect(model.hub).toBe('ok');
    expect(model.jobs).toEqual([]);
  });

  it('asks the quota every third tick, and at once when a job changes state', async () => {
    await vi.advanceTimersByTimeAsync(10);
    await vi.advanceTimersByTimeAsync(2 * INTERVAL);
    expect([client.count('jobs'), client.count('me')]).toEqual([3, 1]);
    // A job appears (the list was empty): the quota bar must follow at once.
    client.jobList = [job(1, 'running')];
    await vi.advanceTimersByTimeAsync(INTERVAL);
    expect([client.count('jobs'), client.count('me'), client.count('idle')]).toEqual([4, 2, 2]);
    // Nothing changed: no extra quota request on the next tick ...
    await vi.advanceTimersByTimeAsync(INTERVAL);
    expect(client.count('me')).toBe(2);
    // ... and the job's end is seen the same way.
    client.jobList = [job(1, 'succeeded')];
    await vi.advanceTimersByTimeAsync(INTERVAL);
    expect(client.count('me')).toBe(3);
  });

  it('ticks every second while a job runs, asking only the jobs between normal ticks', async () => {
    model.dispose();
    model = new GpuStatusModel({
      client,
      interval: 5000,
      activeInterval: 1000,
      maxInterval: MAX,
      slowEvery: 3
    });
    await vi.advanceTimersByTimeAsync(10);
    await vi.advanceTimersByTimeAsync(5000);
    expect([client.count('jobs'), client.count('session')]).toEqual([2, 2]); // nothing runs: every 5 s
    client.jobList = [job(1, 'running')];
    await vi.advanceTimersByTimeAsync(5000); // the normal tick sees the job: the quota follows at once
    const [jobs, session, me] = ['jobs', 'session', 'me'].map(p => client.count(p));
    expect(me).toBe(2);
    await vi.advanceTimersByTimeAsync(3000);
    // Three jobs-only ticks in 3 s; the session and the quota keep their pace.
    expect(client.count('jobs')).toBe(jobs + 3);
    expect([client.count('session'), client.count('me')]).toEqual([session, me]);
    // The job ends: seen within a second, with the quota and idle state at once ...
    const seen: string[] = [];
    model.jobsChanged.connect((_, j) => seen.push(j[0].state));
    client.jobList = [job(1, 'succeeded')];
    await vi.advanceTimersByTimeAsync(1000);
    expect(seen).toEqual(['succeeded']);
    expect(client.count('me')).toBe(me + 1);
    // ... and with nothing running the poll goes back to every 5 s.
    const after = client.count('jobs');
    await vi.advanceTimersByTimeAsync(4000);
    expect(client.count('jobs')).toBe(after);
    await vi.advanceTimersByTimeAsync(1000);
    expect(client.count('jobs')).toBe(after + 1);
  });

  it('backs off exponentially while the hub fails, up to the maximum, and recovers', async () => {
    vi.spyOn(Math, 'random').mockReturnValue(1 - 1e-9); // Lumino draws the next wait at random: take the longest
    await vi.advanceTimersByTimeAsync(10);
    client.failing.jobs = hubDown();
    const from = client.count('jobs') - 1;
    await vi.advanceTimersByTimeAsync(250 * 1000);
    const failing = gaps(client.times('jobs').slice(from));
    expect(failing.slice(0, 6)).toEqual([
      INTERVAL,
      3 * INTERVAL,
      9 * INTERVAL,
      27 * INTERVAL,
      MAX,
      MAX
    ]);
    expect(Math.max(...failing)).toBe(MAX);
    expect(model.errors.jobs).toContain('not reachable');
    expect(model.session?.profile).toBe('h100-half'); // what answered is still shown
    delete client.failing.jobs;
    await vi.advanceTimersByTimeAsync(MAX + 3 * INTERVAL); // the next (backed-off) tick succeeds ...
    expect(gaps(client.times('jobs')).slice(-3)).toEqual([INTERVAL, INTERVAL, INTERVAL]); // ... pace restored
    expect(model.errors).toEqual({});
  });

  it('explains a hub without gpulab instead of failing, and stops asking it every tick', async () => {
    client.failing.jobs = noGpulab();
    await vi.advanceTimersByTimeAsync(10);
    expect(model.hub).toBe('no-gpulab');
    expect(model.errors).toEqual({});
    expect(model.jobs).toBeNull();
    await vi.advanceTimersByTimeAsync(5 * INTERVAL);
    // No back-off (nothing failed), the session keeps its pace, the hub is probed every third tick.
    expect(client.count('session')).toBe(6);
    expect(client.count('jobs')).toBe(2);
  });

  it('says when the server extension itself is missing', async () => {
    const { GPULabAPIError } = await import('../src/errors');
    client.failing.session = new GPULabAPIError(404, 'Not Found');
    await vi.advanceTimersByTimeAsync(10);
    expect(model.hub).toBe('no-extension');
    expect(client.count('jobs')).toBe(0);
  });

  it('refresh() asks the quota at once', async () => {
    await vi.advanceTimersByTimeAsync(10);
    await model.refresh();
    await vi.advanceTimersByTimeAsync(10);
    expect(client.count('me')).toBe(2);
  });
});

describe('GpuStatusModel: "Stop server and release GPU"', () => {
  it('says the server is stopping once it no longer answers, and stops asking', async () => {
    vi.useFakeTimers();
    const client = new FakeClient();
    const model = new GpuStatusModel({ client, interval: INTERVAL });
    await vi.advanceTimersByTimeAsync(10);
    const seen: string[] = [];
    model.stopChanged.connect((_, s) => seen.push(s?.state ?? ''));
    await model.requestStop();
    expect(model.stop?.state).toBe('requested');
    await vi.advanceTimersByTimeAsync(INTERVAL + 10);
    expect(seen).toEqual(['requested']); // still answering: nothing to say yet
    client.failing.session = hubDown(); // the proxy route is gone: the hub answers for the server
    await vi.advanceTimersByTimeAsync(INTERVAL + 10);
    expect(seen).toEqual(['requested', 'stopping']);
    expect(model.stop?.message).toContain('releases its GPU as soon as the server has shut down');
    const asked = client.calls.length;
    await vi.advanceTimersByTimeAsync(10 * INTERVAL);
    expect(client.calls.length).toBe(asked); // nothing left to ask
    expect(model.isDisposed).toBe(true);
    vi.useRealTimers();
  });
});
