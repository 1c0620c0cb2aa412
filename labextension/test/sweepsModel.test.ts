import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { SweepsModel, takeTableStart } from '../src/sweepsModel';
import { ISweep } from '../src/types';

function sweep(id: number, runs = 0): ISweep {
  return {
    id,
    name: `s${id}`,
    user: 'alice',
    team: 'vision',
    profile: 'cpu',
    job_class: 'batch',
    kind: 'notebook',
    notebook: 'a.ipynb',
    grid: { lr: [0.1] },
    max_parallel: 1,
    objective: null,
    state: 'active',
    reason: '',
    runs_total: runs,
    counts: {},
    best_run: null,
    parameter_names: ['lr'],
    metric_names: [],
    metrics_readable: true,
    created_at: '2026-12-01T00:00:00Z',
    finished_at: null,
    ...(runs ? { runs: [] } : {})
  };
}

describe('SweepsModel: the sweeps on one Lumino Poll', () => {
  const asked: string[] = [];
  let failing = false;
  const client = {
    sweeps: async () => {
      asked.push('list');
      if (failing) {
        throw new Error('hub down');
      }
      return [sweep(2), sweep(1)];
    },
    sweep: async (id: number) => {
      asked.push(`sweep ${id}`);
      return sweep(id, 3);
    }
  };
  let model: SweepsModel;

  beforeEach(() => {
    vi.useFakeTimers();
    asked.length = 0;
    failing = false;
    model = new SweepsModel({ client, interval: 1000, standby: 'never' });
  });
  afterEach(() => {
    model.dispose();
    vi.useRealTimers();
  });

  it('asks the list each tick, and the opened sweep with it', async () => {
    await vi.advanceTimersByTimeAsync(10);
    expect(asked).toEqual(['list']);
    expect(model.sweeps?.map(s => s.id)).toEqual([2, 1]);
    expect(model.open).toBeNull();
    const opened = model.select(1); // asked at once: the poll's refresh, not its interval
    await vi.advanceTimersByTimeAsync(10);
    await opened;
    expect(model.open?.id).toBe(1);
    expect(takeTableStart()).not.toBeNull(); // the table's next render measures from the data's arrival
    expect(takeTableStart()).toBeNull(); // once
    asked.length = 0;
    await vi.advanceTimersByTimeAsync(1000);
    expect(asked.sort()).toEqual(['list', 'sweep 1']);
    const closed = model.select(null);
    expect(model.open).toBeNull(); // at once, before the next answer
    await vi.advanceTimersByTimeAsync(10);
    await closed;
  });

  it('keeps what answered and says the error when the hub fails', async () => {
    await vi.advanceTimersByTimeAsync(10);
    failing = true;
    await vi.advanceTimersByTimeAsync(1000);
    expect(model.error).toBe('hub down');
    expect(model.sweeps?.length).toBe(2);
  });
});
