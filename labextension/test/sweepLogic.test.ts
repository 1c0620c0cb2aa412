import { describe, expect, it } from 'vitest';

import { IJobForm } from '../src/logic';
import {
  buildSweepRequest,
  cellText,
  columnId,
  countsText,
  EMPTY_SWEEP,
  gridRuns,
  nextSort,
  parseGrid,
  sortRuns,
  sweepColumns,
  sweepErrors
} from '../src/sweepLogic';
import { ISweepRun } from '../src/types';

const FORM: IJobForm = {
  notebook: 'exp/train.ipynb',
  jobClass: 'batch',
  team: 'vision',
  profile: 'h100-half',
  parameters: [
    { name: 'lr', value: '0.1' },
    { name: 'epochs', value: '3' }
  ],
  timeLimitMinutes: '60',
  name: 'lr sweep'
};

function run(
  index: number,
  parameters: ISweepRun['parameters'],
  metrics: ISweepRun['metrics'],
  state = 'succeeded'
): ISweepRun {
  return {
    index,
    parameters,
    metrics,
    state: state as ISweepRun['state'],
    reason: '',
    job_id: index + 10,
    output_path: '',
    log_path: '',
    started_at: null,
    finished_at: null,
    attempts: 1
  };
}

describe('the dialog grid', () => {
  it('reads one parameter per line, values as literals', () => {
    const { grid, errors } = parseGrid(
      'lr = 1e-4, 3e-4, 0.001\nseed = [0, 1]\nopt = "adam", sgd\namp = True, False\n# a comment'
    );
    expect(errors).toEqual([]);
    expect(grid).toEqual({
      lr: [1e-4, 3e-4, 0.001],
      seed: [0, 1],
      opt: ['adam', 'sgd'],
      amp: [true, false]
    });
    expect(gridRuns(grid)).toBe(3 * 2 * 2 * 2);
  });

  it('says what is wrong, line by line', () => {
    expect(parseGrid('lr 0.1').errors[0]).toMatch(/Line 1: write it as name = value/);
    expect(parseGrid('lr = 0.1\nlr = 0.2').errors[0]).toMatch(/Line 2: lr is in the grid twice/);
    expect(parseGrid('lr = ').errors[0]).toMatch(/lr has no values/);
    expect(parseGrid('lr = 0.1, 0.1').errors[0]).toMatch(/lists a value twice/);
    expect(parseGrid('lr = [1, 2], None').errors[0]).toMatch(/a string, a number or True\/False/);
    expect(parseGrid('').grid).toBeNull();
    expect(gridRuns(null)).toBe(0);
  });

  it('builds a sweep request: the job, the grid over its own parameters, the cap and objective', () => {
    const built = buildSweepRequest(FORM, {
      grid: 'lr = 0.001, 0.01',
      maxParallel: '2',
      metric: 'loss',
      direction: 'min'
    });
    expect(built.errors).toEqual([]);
    expect(built.request).toMatchObject({
      notebook: 'exp/train.ipynb',
      job_class: 'batch',
      profile: 'h100-half',
      parameters: { epochs: 3 },
      grid: { lr: [0.001, 0.01] },
      max_parallel: 2,
      objective: { metric: 'loss', direction: 'min' },
      name: 'lr sweep'
    });
  });

  it('refuses a bad grid or cap before the hub does', () => {
    expect(
      sweepErrors({ ...EMPTY_SWEEP, grid: 'lr = 0.1', maxParallel: '0' }).max_parallel
    ).toMatch(/at least 1/);
    const built = buildSweepRequest(FORM, { ...EMPTY_SWEEP, grid: 'oops' });
    expect(built.request).toBeNull();
    expect(built.errors.join(' ')).toMatch(/name = value/);
  });
});

describe('the sweep table', () => {
  const runs = [
    run(0, { lr: 0.1, seed: 0 }, { loss: 0.5 }),
    run(1, { lr: 0.01, seed: 0 }, { loss: 0.25, acc: 0.9 }),
    run(2, { lr: 0.001, seed: 1 }, {}, 'running'),
    run(3, { lr: 0.01, seed: 1 }, { loss: 0.125 })
  ];
  const columns = sweepColumns(['lr', 'seed'], ['acc', 'loss'], 'loss');

  it('has #, the parameters, state, the metrics with the objective first', () => {
    expect(columns.map(columnId)).toEqual([
      'index:index',
      'parameter:lr',
      'parameter:seed',
      'state:state',
      'metric:loss',
      'metric:acc'
    ]);
  });

  it('sorts by any column, stable, runs without the value last either way', () => {
    const by = (column: string, direction: 'ascending' | 'descending') =>
      sortRuns(runs, columns, { column, direction }).map(r => r.index);
    expect(by('metric:loss', 'ascending')).toEqual([3, 1, 0, 2]);
    expect(by('metric:loss', 'descending')).toEqual([0, 1, 3, 2]);
    expect(by('parameter:lr', 'ascending')).toEqual([2, 1, 3, 0]);
    expect(by('state:state', 'ascending')).toEqual([2, 0, 1, 3]);
    expect(by('metric:acc', 'descending')).toEqual([1, 0, 2, 3]);
    expect(by('index:index', 'descending')).toEqual([3, 2, 1, 0]);
  });

  it('flips a column, starts another ascending', () => {
    const s = nextSort({ column: 'index:index', direction: 'ascending' }, 'metric:loss');
    expect(s).toEqual({ column: 'metric:loss', direction: 'ascending' });
    expect(nextSort(s, 'metric:loss').direction).toBe('descending');
  });

  it('shows cells and counts in words', () => {
    const loss = columns[4];
    expect(cellText(run(0, {}, { loss: 0.123456 }), loss)).toBe('0.1235');
    expect(cellText(run(0, {}, {}), loss)).toBe('–');
    expect(
      cellText(run(0, { amp: true }, {}), { kind: 'parameter', key: 'amp', label: 'amp' })
    ).toBe('True');
    expect(countsText(6, { succeeded: 3, running: 2, waiting: 1 })).toBe(
      '6 runs: 2 running, 3 succeeded, 1 waiting'
    );
  });
});
