/**
 * The user's sweeps as the sidebar shows them: the list (newest first) and the one
 * sweep opened in full (every run's parameters, state and metrics).
 *
 * One Lumino `Poll` refreshes both: it stands by while the tab is hidden, backs off
 * on errors, and ticks at once when a sweep is opened, submitted or cancelled.
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { message } from './errors';
import { ISweep } from './types';

/** What the model asks of the hub (api.ts in the lab; a fake in the tests). */
export interface ISweepsClient {
  sweeps(): Promise<ISweep[]>;
  sweep(id: number): Promise<ISweep>;
}

/**
 * When the table's newest data (or a new sort) arrived: the table's next commit measures from
 * here to its DOM (`gpulab-sweep-table` in the page's performance timeline).
 */
let tableStart: number | null = null;

export function markTableStart(): void {
  tableStart = performance.now();
}

/** The start the next measure runs from (once), or null. */
export function takeTableStart(): number | null {
  const start = tableStart;
  tableStart = null;
  return start;
}

export interface ISweepsOptions {
  client: ISweepsClient;
  /** Milliseconds between ticks (default 5000; a sweep's runs change at the jobs' pace). */
  interval?: number;
  standby?: Poll.Standby | (() => boolean | Poll.Standby);
}

export class SweepsModel {
  constructor(options: ISweepsOptions) {
    this._client = options.client;
    this._poll = new Poll({
      factory: () => this._tick(),
      frequency: { interval: options.interval ?? 5000, backoff: true, max: 5 * 60 * 1000 },
      name: 'gpulab:sweeps',
      standby: options.standby ?? 'when-hidden'
    });
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }
  /** The user's sweeps (without runs); `null` before the first answer. */
  get sweeps(): ISweep[] | null {
    return this._sweeps;
  }
  /** The opened sweep, with its runs; `null` when none is open (or before it answered). */
  get open(): ISweep | null {
    return this._open;
  }
  get openId(): number | null {
    return this._openId;
  }
  get error(): string | undefined {
    return this._error;
  }
  get poll(): Poll {
    return this._poll;
  }

  /** Open one sweep's table (or close it with `null`); asked at once. */
  async select(id: number | null): Promise<void> {
    this._openId = id;
    if (id === null || this._open?.id !== id) {
      this._open = null;
    }
    this._changed.emit();
    await this.refresh();
  }

  /** Ask now (after a submit or a cancel). */
  async refresh(): Promise<void> {
    await this._poll.refresh();
    await this._poll.tick;
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _tick(): Promise<void> {
    try {
      const id = this._openId;
      const [list, open] = await Promise.all([
        this._client.sweeps(),
        id === null ? Promise.resolve(null) : this._client.sweep(id)
      ]);
      this._sweeps = list;
      if (id === this._openId) {
        this._open = open;
        if (open) {
          markTableStart();
        }
      }
      this._error = undefined;
    } catch (e) {
      this._error = message(e);
      this._changed.emit();
      throw e; // the Poll backs off; what answered before is shown meanwhile
    }
    this._changed.emit();
  }

  private _client: ISweepsClient;
  private _poll: Poll;
  private _sweeps: ISweep[] | null = null;
  private _open: ISweep | null = null;
  private _openId: number | null = null;
  private _error: string | undefined;
  private _changed = new Signal<this, void>(this);
}
