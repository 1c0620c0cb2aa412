/**
 * Sweeps, the pure part of the lab's views: the dialog's grid (one line per
 * parameter, `lr = 0.0001, 0.0003, 0.001`), how many runs it makes, the table's
 * columns and how its rows sort. No DOM, no requests: unit-tested (test/sweepLogic.test.ts).
 */
import { buildJobRequest, IJobForm, parameterValue } from './logic';
import { ISweepRequest, ISweepRun, SweepValue } from './types';

/** The dialog's sweep fields, as typed. */
export interface ISweepForm {
  /** One line per parameter: `name = value, value, ...`; empty: a single job. */
  grid: string;
  /** At most this many runs at once, as typed ('' = the hub's default). */
  maxParallel: string;
  /** The metric that picks the best run ('' = none), and whether less or more is better. */
  metric: string;
  direction: 'min' | 'max';
}

export const EMPTY_SWEEP: ISweepForm = { grid: '', maxParallel: '', metric: '', direction: 'min' };

/** Split a line's values at commas outside quotes and brackets. */
function splitValues(text: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let quote = '';
  let current = '';
  for (const ch of text) {
    if (quote) {
      current += ch;
      if (ch === quote) {
        quote = '';
      }
    } else if (ch === '"' || ch === "'") {
      quote = ch;
      current += ch;
    } else if (ch === '[' || ch === '(' || ch === '{') {
      depth += 1;
      current += ch;
    } else if (ch === ']' || ch === ')' || ch === '}') {
      depth -= 1;
      current += ch;
    } else if (ch === ',' && depth === 0) {
      out.push(current.trim());
      current = '';
    } else {
      current += ch;
    }
  }
  out.push(current.trim());
  return out.filter(v => v !== '');
}

/**
 * The grid a user typed: `{lr: [0.0001, 0.001], seed: [0, 1]}`, or the problems, line by line.
 * Values read as Python/JSON literals where they are ones (`1e-4`, `True`, `"adam"`), else as text.
 */
export function parseGrid(text: string): {
  grid: Record<string, SweepValue[]> | null;
  errors: string[];
} {
  const grid: Record<string, SweepValue[]> = {};
  const errors: string[] = [];
  text.split('\n').forEach((raw, i) => {
    const line = raw.trim();
    if (!line || line.startsWith('#')) {
      return;
    }
    const m = /^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$/.exec(line);
    if (!m) {
      errors.push(`Line ${i + 1}: write it as name = value, value, … (e.g. lr = 0.0001, 0.001).`);
      return;
    }
    const [, name, rest] = m;
    if (name in grid) {
      errors.push(`Line ${i + 1}: ${name} is in the grid twice.`);
      return;
    }
    const inner = rest.trim().replace(/^\[(.*)\]$/, '$1');
    const values = splitValues(inner).map(v => parameterValue(v));
    if (values.length === 0) {
      errors.push(`Line ${i + 1}: ${name} has no values.`);
      return;
    }
    const bad = values.find(v => !['string', 'number', 'boolean'].includes(typeof v) || v === null);
    if (bad !== undefined) {
      errors.push(
        `Line ${i + 1}: ${name}: each value must be a string, a number or True/False, not ${JSON.stringify(bad)}.`
      );
      return;
    }
    const seen = new Set(values.map(v => JSON.stringify(v)));
    if (seen.size !== values.length) {
      errors.push(`Line ${i + 1}: ${name} lists a value twice.`);
      return;
    }
    grid[name] = values as SweepValue[];
  });
  return { grid: errors.length === 0 && Object.keys(grid).length > 0 ? grid : null, errors };
}

/** How many runs a grid makes: the product of its lists' lengths. */
export function gridRuns(grid: Record<string, unknown[]> | null): number {
  if (!grid || Object.keys(grid).length === 0) {
    return 0;
  }
  return Object.values(grid).reduce((n, values) => n * values.length, 1);
}

/** Is the form a sweep (a grid was typed)? */
export function isSweep(sweep: ISweepForm | undefined): boolean {
  return !!sweep && sweep.grid.trim() !== '';
}

/** The sweep's own field errors (the grid, the cap). */
export function sweepErrors(sweep: ISweepForm): { grid?: string; max_parallel?: string } {
  const out: { grid?: string; max_parallel?: string } = {};
  if (!isSweep(sweep)) {
    return out;
  }
  const parsed = parseGrid(sweep.grid);
  if (parsed.errors.length) {
    out.grid = parsed.errors.join(' ');
  }
  const cap = sweep.maxParallel.trim();
  if (cap !== '' && (!Number.isInteger(Number(cap)) || Number(cap) < 1)) {
    out.max_parallel = 'At most … at once must be a whole number, at least 1.';
  }
  return out;
}

/** The sweep's request: the job's (as the dialog builds it) plus the grid, cap and objective. */
export function buildSweepRequest(
  form: IJobForm,
  sweep: ISweepForm
): { request: ISweepRequest; errors: [] } | { request: null; errors: string[] } {
  const built = buildJobRequest(form);
  const own = Object.values(sweepErrors(sweep)).filter((e): e is string => !!e);
  if (built.request === null || own.length) {
    return { request: null, errors: [...(built.request === null ? built.errors : []), ...own] };
  }
  const grid = parseGrid(sweep.grid).grid ?? {};
  const request: ISweepRequest = { ...built.request, grid };
  // The grid's values win over the notebook's own parameters of the same name (the hub merges them so too).
  if (request.parameters) {
    request.parameters = Object.fromEntries(
      Object.entries(request.parameters).filter(([k]) => !(k in grid))
    );
  }
  if (sweep.maxParallel.trim()) {
    request.max_parallel = Number(sweep.maxParallel.trim());
  }
  if (sweep.metric.trim()) {
    request.objective = { metric: sweep.metric.trim(), direction: sweep.direction };
  }
  return { request, errors: [] };
}

// -- the table ------------------------------------------------------------------------------

/** A sortable column: the run's index, a parameter, its state, or a metric. */
export type SweepColumn =
  | { kind: 'index'; key: 'index'; label: string }
  | { kind: 'parameter'; key: string; label: string }
  | { kind: 'state'; key: 'state'; label: string }
  | { kind: 'metric'; key: string; label: string };

export interface ISort {
  column: string;
  direction: 'ascending' | 'descending';
}

/** The columns of a sweep's table: #, its parameters, state, its metrics (the objective's first). */
export function sweepColumns(
  parameters: string[],
  metrics: string[],
  objective: string | null
): SweepColumn[] {
  const ordered =
    objective && metrics.includes(objective)
      ? [objective, ...metrics.filter(m => m !== objective)]
      : metrics;
  return [
    { kind: 'index', key: 'index', label: '#' },
    ...parameters.map(p => ({ kind: 'parameter' as const, key: p, label: p })),
    { kind: 'state', key: 'state', label: 'State' },
    ...ordered.map(m => ({ kind: 'metric' as const, key: m, label: m }))
  ];
}

/** A column's id (parameters and metrics may share a name). */
export function columnId(c: SweepColumn): string {
  return `${c.kind}:${c.key}`;
}

function cellValue(run: ISweepRun, c: SweepColumn): SweepValue | undefined {
  switch (c.kind) {
    case 'index':
      return run.index;
    case 'state':
      return run.state;
    case 'parameter':
      return run.parameters[c.key];
    case 'metric':
      return run.metrics[c.key];
  }
}

/** What a cell shows: a number to 4 significant digits (or as typed when exact), text as is, – for none. */
export function cellText(run: ISweepRun, c: SweepColumn): string {
  const v = cellValue(run, c);
  if (v === undefined) {
    return '–';
  }
  if (typeof v === 'number' && c.kind === 'metric' && !Number.isInteger(v)) {
    return Number(v.toPrecision(4)).toString();
  }
  return typeof v === 'boolean' ? (v ? 'True' : 'False') : String(v);
}

function compare(a: SweepValue | undefined, b: SweepValue | undefined): number {
  // Missing values sort last, whichever the direction (see sortRuns).
  if (typeof a === 'number' && typeof b === 'number') {
    return a - b;
  }
  return String(a).localeCompare(String(b), undefined, { numeric: true });
}

/** The runs sorted by a column (a stable sort; runs without a value last either way). */
export function sortRuns(runs: ISweepRun[], columns: SweepColumn[], sort: ISort): ISweepRun[] {
  const column = columns.find(c => columnId(c) === sort.column) ?? columns[0];
  const sign = sort.direction === 'ascending' ? 1 : -1;
  return runs
    .map((run, i) => ({ run, i, v: cellValue(run, column) }))
    .sort((x, y) => {
      if (x.v === undefined || y.v === undefined) {
        return x.v === y.v ? x.i - y.i : x.v === undefined ? 1 : -1;
      }
      return sign * compare(x.v, y.v) || x.i - y.i;
    })
    .map(x => x.run);
}

/** The next sort when a column's header is pressed: the same column flips, another starts ascending. */
export function nextSort(sort: ISort, column: string): ISort {
  if (sort.column === column) {
    return { column, direction: sort.direction === 'ascending' ? 'descending' : 'ascending' };
  }
  return { column, direction: 'ascending' };
}

/** "6 runs: 2 running, 3 succeeded, 1 waiting" */
export function countsText(total: number, counts: Record<string, number>): string {
  const parts = Object.entries(counts)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([state, n]) => `${n} ${state}`);
  return `${total} run${total === 1 ? '' : 's'}${parts.length ? ': ' + parts.join(', ') : ''}`;
}
