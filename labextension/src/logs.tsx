/** A main-area log viewer for one job that tails the log while the job runs. */
import { ReactWidget } from '@jupyterlab/ui-components';
import { Poll } from '@lumino/polling';
import React, { useEffect, useRef, useState } from 'react';

import { api } from './api';
import { IJob } from './types';

function LogView({ job }: { job: IJob }): JSX.Element {
  const [text, setText] = useState('');
  const [complete, setComplete] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const pre = useRef<HTMLPreElement>(null);
  useEffect(() => {
    // Tail with a Lumino Poll: stands by while the tab is hidden, backs off while the hub fails.
    let offset = 0;
    const poll = new Poll({
      factory: async () => {
        try {
          const chunk = await api.logs(job.id, offset);
          offset = chunk.offset;
          if (chunk.text) {
            setText(t => t + chunk.text);
          }
          setError(null);
          if (chunk.complete) {
            setComplete(true);
            poll.dispose();
          }
        } catch (e) {
          setError(e instanceof Error ? e.message : String(e));
          throw e;
        }
      },
      frequency: { interval: 2000, backoff: true, max: 60 * 1000 },
      name: `gpulab:log-${String(job.id)}`,
      standby: 'when-hidden'
    });
    return () => poll.dispose();
  }, [job.id]);
  useEffect(() => {
    const el = pre.current;
    if (el && el.scrollHeight - el.scrollTop - el.clientHeight < 80) {
      el.scrollTop = el.scrollHeight; // follow the tail unless the user scrolled up
    }
  }, [text]);
  return (
    <div className="gpulab-logs">
      <div className="gpulab-logs-head" role="status" aria-live="polite">
        Job {String(job.id)} ({job.notebook}): {complete ? 'log complete' : 'tailing…'}
        {error && <span className="gpulab-error"> {error}</span>}
      </div>
      <pre
        ref={pre}
        className="gpulab-logs-text"
        tabIndex={0}
        aria-label={`Log of job ${String(job.id)}`}
      >
        {text}
      </pre>
    </div>
  );
}

export class JobLogWidget extends ReactWidget {
  constructor(private readonly _job: IJob) {
    super();
    this.addClass('gpulab-logs-widget');
  }

  render(): JSX.Element {
    return <LogView job={this._job} />;
  }
}
