/**
 * Pure logic of the GPU panel and the job dialog (no DOM, no network), so it
 * can be unit tested: formatting, the quota bar, countdowns, the notebook's
 * `parameters` cell, and validation of a job request.
 */
import { warnedLifetime } from './idleLogic';
import { IIdleState, IJob, IJobRequest, ITeamView, JobClass, JobState } from './types';

const MILLI_PER_GPU = 1000;

/** `500` -> `"0.5"`, `7500` -> `"7.5"`, `2000` -> `"2"` (as spawner/core/units.py format_gpus). */
export function formatGPUs(milli: number): string {
  const whole = Math.floor(milli / MILLI_PER_GPU);
  const frac = milli % MILLI_PER_GPU;
  if (frac === 0) {
    return String(whole);
  }
  return `${whole}.${String(frac).padStart(3, '0')}`.replace(/0+$/, '');
}

export interface IQuotaSegments {
  /** Percentages of the burst limit (they add up to 100 when burst > 0). */
  inQuota: number;
  burst: number;
  free: number;
  /** Where the guarantee ends, as a percentage of the burst limit. */
  guaranteeAt: number;
  label: string;
}

/** The team quota bar: held within the guarantee, held above it (burst), free. */
export function quotaSegments(team: ITeamView): IQuotaSegments {
  const total = Math.max(team.burst_milli, 0);
  const pct = (m: number) => (total > 0 ? (100 * Math.max(m, 0)) / total : 0);
  const inQuota = pct(team.in_quota_milli);
  const burst = pct(team.over_quota_milli);
  const free = total > 0 ? Math.max(0, 100 - inQuota - burst) : 0;
  const label =
    `Team ${team.name}: ${formatGPUs(team.in_quota_milli)} GPUs in quota, ` +
    `${formatGPUs(team.over_quota_milli)} burst, ${formatGPUs(team.free_milli)} free ` +
    `(guarantee ${formatGPUs(team.guarantee_milli)}, burst limit ${formatGPUs(team.burst_milli)})`;
  return { inQuota, burst, free, guaranteeAt: pct(team.guarantee_milli), label };
}

/** `42` -> `"42 s"`, `192` -> `"3 min 12 s"`, `7500` -> `"2 h 05 min"`. */
export function formatDuration(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`;
  }
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')} min`;
}

/** `"mm:ss"` (or `"h:mm:ss"`) until `until`; `"0:00"` once it has passed. */
export function formatCountdown(until: string, now: number): string {
  const left = Math.max(0, Math.floor((Date.parse(until) - now) / 1000));
  const h = Math.floor(left / 3600);
  const m = Math.floor((left % 3600) / 60);
  const sec = String(left % 60).padStart(2, '0');
  return h > 0 ? `${h}:${String(m).padStart(2, '0')}:${sec}` : `${m}:${sec}`;
}

const TERMINAL: JobState[] = ['succeeded', 'failed', 'cancelled', 'timed-out'];

export function isTerminal(state: JobState): boolean {
  return TERMINAL.includes(state);
}

export function canCancel(job: IJob): boolean {
  return job.state === 'queued' || job.state === 'running' || job.state === 'preempted';
}

/** Seconds the job has run (to now while running); `null` before it started. */
export function jobDuration(job: IJob, now: number): number | null {
  if (!job.started_at) {
    return null;
  }
  const end = job.finished_at ? Date.parse(job.finished_at) : now;
  return Math.max(0, (end - Date.parse(job.started_at)) / 1000);
}

/** The keep-alive button's state: may the user press it, and what it says. */
export function keepAliveState(idle: IIdleState): { enabled: boolean; label: string } {
  const { used, max, extends_seconds } = idle.keepalive;
  if (warnedLifetime(idle) !== null) {
    return { enabled: false, label: 'Maximum lifetime reached: "Keep my GPU" cannot extend it' };
  }
  if (used >= max) {
    return { enabled: false, label: `Keep-alive limit reached (${used} of ${max} used)` };
  }
  return {
    enabled: true,
    label: `Keep my GPU for ${formatDuration(extends_seconds)} more (${used} of ${max} used)`
  };
}

/** SVG path of a sparkline of percentages (0..100) in a `width` × `height` box. */
export function sparklinePath(
  values: number[],
  width: number,
  height: number,
  slots: number
): string {
  if (values.length === 0) {
    return '';
  }
  const step = slots > 1 ? width / (slots - 1) : width;
  const offset = (slots - values.length) * step;
  return values
    .map((v, i) => {
      const x = offset + i * step;
      const y = height - (Math.min(100, Math.max(0, v)) / 100) * height;
      return `${i === 0 ? 'M' : 'L'}${x.toFixed(1)},${y.toFixed(1)}`;
    })
    .join(' ');
}

// -- notebook parameters ----------------------------------------------------

/** Strip a trailing `# comment` that is not inside a string literal. */
function stripComment(line: string): string {
  let quote: string | null = null;
  for (let i = 0; i < line.length; i++) {
    const ch = line[i];
    if (quote) {
      if (ch === '\\') {
        i++;
      } else if (ch === quote) {
        quote = null;
      }
    } else if (ch === '"' || ch === "'") {
      quote = ch;
    } else if (ch === '#') {
      return line.slice(0, i);
    }
  }
  return line;
}

/** Convert a single-quoted Python string literal's body to a JSON string. */
function pyStringToJSON(body: string): string {
  return '"' + body.replace(/\\'/g, "'").replace(/"/g, '\\"') + '"';
}

/**
 * The value of a Python literal as papermill would inject it, or `undefined`
 * when the text is not a literal we can read (an expression, a call).
 */
export function parsePythonLiteral(text: string): unknown {
  const t = text.trim();
  if (t === 'True') {
    return true;
  }
  if (t === 'False') {
    return false;
  }
  if (t === 'None') {
    return null;
  }
  if (/^[+-]?(\d[\d_]*)(\.\d*)?([eE][+-]?\d+)?$/.test(t) || /^[+-]?\.\d+([eE][+-]?\d+)?$/.test(t)) {
    return Number(t.replace(/_/g, ''));
  }
  if (/^'(?:[^'\\]|\\.)*'$/.test(t)) {
    return JSON.parse(pyStringToJSON(t.slice(1, -1)));
  }
  if (/^"(?:[^"\\]|\\.)*"$/.test(t)) {
    return JSON.parse(t);
  }
  if (/^[[{(]/.test(t)) {
    // Containers of literals: rewrite the Python spellings, then read as JSON.
    let json = '';
    let quote: string | null = null;
    let buf = '';
    for (let i = 0; i < t.length; i++) {
      const ch = t[i];
      if (quote) {
        if (ch === '\\') {
          buf += ch + t[i + 1];
          i++;
          continue;
        }
        if (ch === quote) {
          json += quote === "'" ? pyStringToJSON(buf) : `"${buf}"`;
          quote = null;
          buf = '';
          continue;
        }
        buf += ch;
        continue;
      }
      if (ch === '"' || ch === "'") {
        quote = ch;
        continue;
      }
      json += ch === '(' ? '[' : ch === ')' ? ']' : ch;
    }
    json = json
      .replace(/\bTrue\b/g, 'true')
      .replace(/\bFalse\b/g, 'false')
      .replace(/\bNone\b/g, 'null')
      .replace(/,\s*([\]}])/g, '$1');
    try {
      return JSON.parse(json);
    } catch {
      return undefined;
    }
  }
  return undefined;
}

/**
 * `name = literal` assignments of a `parameters` cell, in order. Lines that
 * are not such assignments (imports, expressions) are skipped.
 */
export function parseParametersSource(source: string): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const raw of source.split('\n')) {
    const line = stripComment(raw).trim();
    const m = /^([A-Za-z_][A-Za-z0-9_]*)\s*(?::\s*[^=]+)?=(?!=)\s*(.+)$/.exec(line);
    if (!m) {
      continue;
    }
    const value = parsePythonLiteral(m[2]);
    if (value !== undefined) {
      out[m[1]] = value;
    }
  }
  return out;
}

interface ICellLike {
  cell_type?: string;
  metadata?: { tags?: string[] } & Record<string, unknown>;
  source?: string | string[];
}

/** The parameters of a notebook's first `parameters`-tagged code cell (papermill's rule). */
export function notebookParameters(cells: ICellLike[]): Record<string, unknown> {
  for (const cell of cells) {
    const tags = cell.metadata?.tags ?? [];
    if (cell.cell_type === 'code' && Array.isArray(tags) && tags.includes('parameters')) {
      const src = Array.isArray(cell.source) ? cell.source.join('') : (cell.source ?? '');
      return parseParametersSource(src);
    }
  }
  return {};
}

// -- the job dialog's form -----------------------------------------------------

export interface IJobForm {
  /** The notebook (.ipynb, run by papermill) or the Python script (.py) to run. */
  notebook: string;
  /** A script's command line after its name, as typed (`--epochs 3 --name "a b"`). */
  args?: string;
  /** Nodes of the profile's GPUs (training scripts on whole GPUs), as typed. */
  nodes?: string;
  jobClass: JobClass;
  team: string;
  profile: string;
  /** Parameter name -> value as typed (a Python/JSON literal, or plain text). */
  parameters: { name: string; value: string }[];
  timeLimitMinutes: string;
  name: string;
}

/** A typed parameter value: a literal when it reads as one, else the text as a string. */
export function parameterValue(text: string): unknown {
  const v = parsePythonLiteral(text);
  if (v !== undefined) {
    return v;
  }
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** How a parameter value is shown in the form (JSON spelling; strings bare). */
export function parameterText(value: unknown): string {
  return typeof value === 'string' ? value : JSON.stringify(value);
}

/** Does the form run a Python script (else a notebook)? */
export function isScript(path: string): boolean {
  return path.trim().endsWith('.py');
}

/**
 * A typed command line split into arguments as a POSIX shell splits words (quotes and
 * backslashes; nothing is expanded): `--name "a b"` -> `['--name', 'a b']`; null when a
 * quote is left open. The hub receives the list and passes it on as it is.
 */
export function splitArgs(text: string): string[] | null {
  const out: string[] = [];
  let word: string | null = null;
  let quote: '"' | "'" | null = null;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quote === "'") {
      if (c === "'") {
        quote = null;
      } else {
        word += c;
      }
    } else if (quote === '"') {
      if (c === '"') {
        quote = null;
      } else if (c === '\\' && i + 1 < text.length && '"\\$`'.includes(text[i + 1])) {
        word += text[++i];
      } else {
        word += c;
      }
    } else if (c === "'" || c === '"') {
      quote = c;
      word = word ?? '';
    } else if (c === '\\' && i + 1 < text.length) {
      word = (word ?? '') + text[++i];
    } else if (/\s/.test(c)) {
      if (word !== null) {
        out.push(word);
        word = null;
      }
    } else {
      word = (word ?? '') + c;
    }
  }
  if (quote) {
    return null;
  }
  if (word !== null) {
    out.push(word);
  }
  return out;
}

/** `"2 × 8 H100 = 16 GPUs"`: what a job of `nodes` nodes of a profile holds in all. */
export function nodesTotal(nodes: number, profileMilli: number, model: string): string {
  const label = model ? ` ${model}` : '';
  return `${nodes} × ${formatGPUs(profileMilli)}${label} = ${formatGPUs(nodes * profileMilli)} GPUs`;
}

/** The problems of the form's own fields, keyed by field (`param-N`: the Nth parameter's name). */
export type FieldErrors = Partial<
  Record<'notebook' | 'args' | 'nodes' | 'time_limit' | `param-${number}`, string>
>;

export function fieldErrors(form: IJobForm): FieldErrors {
  const out: FieldErrors = {};
  const path = form.notebook.trim().replace(/^\/+/, '');
  if (!path.endsWith('.ipynb') && !path.endsWith('.py')) {
    out.notebook = 'Choose a notebook (.ipynb) or a Python script (.py) to run.';
  }
  if (isScript(path) && splitArgs(form.args ?? '') === null) {
    out.args = 'A quote is left open in the arguments.';
  }
  const nodesText = (form.nodes ?? '1').trim();
  const nodes = Number(nodesText);
  if (nodesText === '' || !Number.isInteger(nodes) || nodes < 1) {
    out.nodes = 'Nodes must be a whole number, at least 1.';
  } else if (nodes > 1 && (!isScript(path) || form.jobClass !== 'training')) {
    out.nodes = 'Only a training job of a script runs on several nodes.';
  }
  const minutes = Number(form.timeLimitMinutes);
  if (
    form.timeLimitMinutes.trim() === '' ||
    !Number.isFinite(minutes) ||
    minutes <= 0 ||
    Math.floor(minutes) !== minutes
  ) {
    out.time_limit = 'The time limit must be a whole number of minutes above 0.';
  }
  const seen = new Set<string>();
  // A script takes arguments, not papermill parameters.
  (isScript(path) ? [] : form.parameters).forEach((p, i) => {
    const name = p.name.trim();
    if (!name) {
      if (p.value.trim()) {
        out[`param-${i}`] = 'Name this parameter, or remove it.';
      }
      return;
    }
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) {
      out[`param-${i}`] = `"${name}" is not a valid Python parameter name.`;
    } else if (seen.has(name)) {
      out[`param-${i}`] = `"${name}" is a parameter twice.`;
    }
    seen.add(name);
  });
  return out;
}

/** The request for `POST /jobs`, or the problems that keep the form from being sent. */
export function buildJobRequest(
  form: IJobForm
): { request: IJobRequest; errors: [] } | { request: null; errors: string[] } {
  const errors = Object.values(fieldErrors(form)).filter((e): e is string => !!e);
  if (!form.profile) {
    errors.push('Choose a GPU profile.');
  }
  if (errors.length) {
    return { request: null, errors };
  }
  const path = form.notebook.trim().replace(/^\/+/, '');
  const request: IJobRequest = {
    job_class: form.jobClass,
    profile: form.profile,
    time_limit_seconds: Number(form.timeLimitMinutes) * 60
  };
  if (isScript(path)) {
    request.script = path;
    request.args = splitArgs(form.args ?? '') ?? [];
    const nodes = Number((form.nodes ?? '1').trim());
    if (nodes > 1) {
      request.nodes = nodes;
    }
  } else {
    const parameters: Record<string, unknown> = {};
    for (const p of form.parameters) {
      if (p.name.trim()) {
        parameters[p.name.trim()] = parameterValue(p.value);
      }
    }
    request.notebook = path;
    request.parameters = parameters;
  }
  if (form.team) {
    request.team = form.team;
  }
  if (form.name.trim()) {
    request.name = form.name.trim();
  }
  return { request, errors: [] };
}
