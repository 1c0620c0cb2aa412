import { describe, expect, it } from 'vitest';

import {
  buildJobRequest,
  canCancel,
  fieldErrors,
  formatCountdown,
  formatDuration,
  formatGPUs,
  IJobForm,
  nodesTotal,
  splitArgs,
  isTerminal,
  jobDuration,
  keepAliveState,
  notebookParameters,
  parameterValue,
  parseParametersSource,
  parsePythonLiteral,
  quotaSegments,
  sparklinePath
} from '../src/logic';
import { errorMessage } from '../src/handler';
import { IIdleState, IJob, ITeamView } from '../src/types';

function team(over: Partial<ITeamView> = {}): ITeamView {
  return {
    name: 'vision',
    display_name: 'Vision',
    guarantee_milli: 2000,
    burst_milli: 4000,
    per_user_cap_milli: null,
    held_milli: 2500,
    in_quota_milli: 2000,
    over_quota_milli: 500,
    free_milli: 1500,
    user_held_milli: 250,
    summary: '1.5 of 4 GPUs free for team vision',
    profiles: [],
    ...over
  };
}

function job(over: Partial<IJob> = {}): IJob {
  return {
    id: 7,
    name: 'sweep',
    user: 'alice',
    team: 'vision',
    profile: 'h100-quarter',
    job_class: 'batch',
    state: 'running',
    reason: null,
    gpu_milli: 250,
    over_quota: false,
    notebook: 'train.ipynb',
    output_path: null,
    log_path: null,
    parameters: {},
    time_limit_seconds: 3600,
    created_at: '2026-01-01T10:00:00Z',
    started_at: '2026-01-01T10:00:30Z',
    finished_at: null,
    history: [],
    ...over
  };
}

describe('formatGPUs', () => {
  it('formats milli-GPUs like the Python core', () => {
    expect(formatGPUs(500)).toBe('0.5');
    expect(formatGPUs(250)).toBe('0.25');
    expect(formatGPUs(7500)).toBe('7.5');
    expect(formatGPUs(2000)).toBe('2');
    expect(formatGPUs(0)).toBe('0');
    expect(formatGPUs(1125)).toBe('1.125');
  });
});

describe('quotaSegments', () => {
  it('splits the burst limit into in-quota, burst and free', () => {
    const s = quotaSegments(team());
    expect(s.inQuota).toBe(50);
    expect(s.burst).toBe(12.5);
    expect(s.free).toBe(37.5);
    expect(s.guaranteeAt).toBe(50);
    expect(s.label).toContain('2 GPUs in quota, 0.5 burst, 1.5 free');
  });

  it('never goes negative or above 100 and survives a zero burst limit', () => {
    const s = quotaSegments(
      team({ burst_milli: 1000, in_quota_milli: 1000, over_quota_milli: 500 })
    );
    expect(s.free).toBe(0);
    const z = quotaSegments(
      team({ burst_milli: 0, guarantee_milli: 0, in_quota_milli: 0, over_quota_milli: 0 })
    );
    expect([z.inQuota, z.burst, z.free, z.guaranteeAt]).toEqual([0, 0, 0, 0]);
  });
});

describe('durations and countdowns', () => {
  it('formats durations', () => {
    expect(formatDuration(42)).toBe('42 s');
    expect(formatDuration(192)).toBe('3 min 12 s');
    expect(formatDuration(7500)).toBe('2 h 05 min');
    expect(formatDuration(-5)).toBe('0 s');
  });

  it('counts down to the reclaim time and stops at zero', () => {
    const now = Date.parse('2026-01-01T10:00:00Z');
    expect(formatCountdown('2026-01-01T10:05:07Z', now)).toBe('5:07');
    expect(formatCountdown('2026-01-01T11:00:05Z', now)).toBe('1:00:05');
    expect(formatCountdown('2026-01-01T09:00:00Z', now)).toBe('0:00');
  });

  it('measures a running job to now and a finished one to its end', () => {
    const now = Date.parse('2026-01-01T10:01:30Z');
    expect(jobDuration(job(), now)).toBe(60);
    expect(jobDuration(job({ finished_at: '2026-01-01T10:00:40Z', state: 'succeeded' }), now)).toBe(
      10
    );
    expect(jobDuration(job({ started_at: null, state: 'queued' }), now)).toBeNull();
  });
});

describe('job states', () => {
  it('knows which states are final and which jobs may be cancelled', () => {
    expect(isTerminal('succeeded')).toBe(true);
    expect(isTerminal('timed-out')).toBe(true);
    expect(isTerminal('running')).toBe(false);
    expect(canCancel(job({ state: 'queued' }))).toBe(true);
    expect(canCancel(job({ state: 'failed' }))).toBe(false);
  });
});

describe('keepAliveState', () => {
  const idle = (used: number, max: number): IIdleState => ({
    user: 'alice',
    server: '',
    warning: { warned_at: '', reclaim_at: '', reason: 'idle', evidence: {} },
    keepalive: { used, max, extends_seconds: 3600, until: null }
  });
  it('honours the policy maximum', () => {
    expect(keepAliveState(idle(0, 2))).toEqual({
      enabled: true,
      label: 'Keep my GPU for 1 h 00 min more (0 of 2 used)'
    });
    expect(keepAliveState(idle(2, 2)).enabled).toBe(false);
    expect(keepAliveState(idle(2, 2)).label).toContain('limit reached');
  });
});

describe('sparklinePath', () => {
  it('draws right-aligned samples clamped to 0..100', () => {
    expect(sparklinePath([], 100, 10, 3)).toBe('');
    expect(sparklinePath([0, 100], 100, 10, 3)).toBe('M50.0,10.0 L100.0,0.0');
    expect(sparklinePath([150], 100, 10, 1)).toBe('M0.0,0.0');
  });
});

describe('parameters cell', () => {
  it('reads Python literals', () => {
    expect(parsePythonLiteral('3')).toBe(3);
    expect(parsePythonLiteral('-1.5e3')).toBe(-1500);
    expect(parsePythonLiteral('1_000')).toBe(1000);
    expect(parsePythonLiteral("'it\\'s'")).toBe("it's");
    expect(parsePythonLiteral('"a \\"b\\""')).toBe('a "b"');
    expect(parsePythonLiteral('True')).toBe(true);
    expect(parsePythonLiteral('None')).toBeNull();
    expect(parsePythonLiteral("[1, 'a', None, (2, 3),]")).toEqual([1, 'a', null, [2, 3]]);
    expect(parsePythonLiteral("{'lr': 0.1, 'on': False}")).toEqual({ lr: 0.1, on: false });
    expect(parsePythonLiteral('np.zeros(3)')).toBeUndefined();
    expect(parsePythonLiteral('x + 1')).toBeUndefined();
  });

  it('reads assignments, skipping comments, annotations-free junk and expressions', () => {
    const src = [
      '# training knobs',
      'epochs = 3  # how many',
      "name: str = 'run # 1'",
      'lr=0.01',
      'import os',
      'data = os.environ["X"]',
      'flag == True',
      'layers = [64, 64]'
    ].join('\n');
    expect(parseParametersSource(src)).toEqual({
      epochs: 3,
      name: 'run # 1',
      lr: 0.01,
      layers: [64, 64]
    });
  });

  it('uses the first code cell tagged "parameters", as papermill does', () => {
    const cells = [
      { cell_type: 'markdown', metadata: { tags: ['parameters'] }, source: 'x = 1' },
      { cell_type: 'code', metadata: {}, source: 'y = 2' },
      {
        cell_type: 'code',
        metadata: { tags: ['parameters'] },
        source: ['greeting = "hi"\n', 'n = 4\n']
      },
      { cell_type: 'code', metadata: { tags: ['parameters'] }, source: 'z = 3' }
    ];
    expect(notebookParameters(cells)).toEqual({ greeting: 'hi', n: 4 });
    expect(notebookParameters([{ cell_type: 'code', source: 'a = 1' }])).toEqual({});
  });
});

describe('buildJobRequest', () => {
  const form = (over: Partial<IJobForm> = {}): IJobForm => ({
    notebook: '/work/train.ipynb',
    jobClass: 'batch',
    team: 'vision',
    profile: 'h100-quarter',
    parameters: [
      { name: 'epochs', value: '5' },
      { name: 'greeting', value: 'hello world' },
      { name: '', value: '' }
    ],
    timeLimitMinutes: '30',
    name: '  ',
    ...over
  });

  it('builds the POST /jobs body with typed parameters', () => {
    const r = buildJobRequest(form());
    expect(r.errors).toEqual([]);
    expect(r.request).toEqual({
      notebook: 'work/train.ipynb',
      job_class: 'batch',
      team: 'vision',
      profile: 'h100-quarter',
      parameters: { epochs: 5, greeting: 'hello world' },
      time_limit_seconds: 1800
    });
  });

  it('refuses bad input with every reason', () => {
    const r = buildJobRequest(
      form({
        notebook: 'x.txt',
        profile: '',
        timeLimitMinutes: '0',
        parameters: [{ name: '1bad', value: '1' }]
      })
    );
    expect(r.request).toBeNull();
    expect(r.errors).toHaveLength(4);
    expect(buildJobRequest(form({ timeLimitMinutes: '2.5' })).errors[0]).toContain('whole number');
  });

  it('says which field is wrong, at the field', () => {
    expect(fieldErrors(form())).toEqual({});
    expect(
      fieldErrors(
        form({
          notebook: '',
          timeLimitMinutes: '',
          parameters: [
            { name: 'a', value: '1' },
            { name: '', value: 'orphan' },
            { name: 'a', value: '2' },
            { name: 'not valid', value: '3' },
            { name: '', value: '' }
          ]
        })
      )
    ).toEqual({
      notebook: 'Choose a notebook (.ipynb) or a Python script (.py) to run.',
      time_limit: 'The time limit must be a whole number of minutes above 0.',
      'param-1': 'Name this parameter, or remove it.',
      'param-2': '"a" is a parameter twice.',
      'param-3': '"not valid" is not a valid Python parameter name.'
    });
  });

  it('builds a script job with its arguments split as a shell would, nothing expanded', () => {
    const r = buildJobRequest(
      form({
        notebook: 'exp/train.py',
        jobClass: 'training',
        args: `--epochs 3 --name "a b" 'it''s' $(id) back\\ slash`,
        nodes: '2'
      })
    );
    expect(r.errors).toEqual([]);
    expect(r.request).toEqual({
      script: 'exp/train.py',
      args: ['--epochs', '3', '--name', 'a b', 'its', '$(id)', 'back slash'],
      nodes: 2,
      job_class: 'training',
      team: 'vision',
      profile: 'h100-quarter',
      time_limit_seconds: 1800
    });
    // A script takes no papermill parameters: the notebook's rows are not checked or sent.
    expect(
      fieldErrors(form({ notebook: 'a.py', parameters: [{ name: '1bad', value: '' }] }))
    ).toEqual({});
  });

  it('says what is wrong with arguments and nodes', () => {
    expect(fieldErrors(form({ notebook: 'a.py', args: '--name "open' }))).toEqual({
      args: 'A quote is left open in the arguments.'
    });
    for (const nodes of ['0', '1.5', '', 'x']) {
      expect(fieldErrors(form({ notebook: 'a.py', jobClass: 'training', nodes })).nodes).toBe(
        'Nodes must be a whole number, at least 1.'
      );
    }
    expect(fieldErrors(form({ notebook: 'a.py', jobClass: 'batch', nodes: '2' })).nodes).toBe(
      'Only a training job of a script runs on several nodes.'
    );
    expect(fieldErrors(form({ jobClass: 'training', nodes: '2' })).nodes).toBe(
      'Only a training job of a script runs on several nodes.'
    );
  });

  it('shows the total of a multi-node job', () => {
    expect(nodesTotal(2, 8000, 'H100')).toBe('2 × 8 H100 = 16 GPUs');
    expect(nodesTotal(1, 500, '')).toBe('1 × 0.5 = 0.5 GPUs');
    expect(splitArgs('')).toEqual([]);
    expect(splitArgs('  a  "" b ')).toEqual(['a', '', 'b']);
  });

  it('types parameter text', () => {
    expect(parameterValue('[1, 2]')).toEqual([1, 2]);
    expect(parameterValue("'quoted'")).toBe('quoted');
    expect(parameterValue('plain text')).toBe('plain text');
  });
});

describe('errorMessage', () => {
  it('shows the API message, never an HTML page', () => {
    expect(errorMessage(403, '{"status": 403, "message": "team vision holds 1 of 1"}')).toBe(
      'team vision holds 1 of 1'
    );
    expect(errorMessage(502, '<html>Bad gateway</html>')).toBe('request failed with HTTP 502');
    expect(errorMessage(500, 'plain failure')).toBe('plain failure');
  });
});
