/**
 * `gpulab-labextension:budget`: the GPU-hour budgets of the user's teams in the GPU sidebar
 * (a section at 80 % and 100 %), and one notification per budget, level and period.
 *
 * Its own Lumino `Poll` on `hub/me/budgets` (the server extension forwards it to the hub):
 * a budget moves over minutes, not seconds, so it asks once a minute, stands by while the
 * tab is hidden and backs off when the hub does not answer.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { ISignal, Signal } from '@lumino/signaling';
import { Poll } from '@lumino/polling';
import React from 'react';

import { budgetBanners, budgetTitle, IBudgets, noticeKey } from './budgetLogic';
import { requestAPI } from './handler';
import { IGpuSidebar } from './tokens';

export class BudgetModel {
  constructor(
    fetch: () => Promise<IBudgets> = () => requestAPI<IBudgets>('hub/me/budgets'),
    interval = 60 * 1000
  ) {
    this._poll = new Poll({
      factory: async () => {
        this._data = await fetch();
        this._changed.emit();
      },
      frequency: { interval, backoff: true, max: 10 * 60 * 1000 },
      name: 'gpulab:budgets',
      standby: 'when-hidden'
    });
  }

  get data(): IBudgets | null {
    return this._data;
  }
  get changed(): ISignal<this, void> {
    return this._changed;
  }
  dispose(): void {
    this._poll.dispose();
  }

  private _data: IBudgets | null = null;
  private _changed = new Signal<this, void>(this);
  private _poll: Poll;
}

function BudgetSection({ model }: { model: BudgetModel }): JSX.Element | null {
  const banners = budgetBanners(model.data);
  if (!banners.length) {
    return null;
  }
  return (
    <section className="gpulab-section gpulab-budgets" aria-labelledby="gpulab-budgets-h">
      <h3 id="gpulab-budgets-h">GPU-hour budget</h3>
      {banners.map(b => (
        <div
          key={b.key}
          className={`gpulab-budget gpulab-budget-${b.level}`}
          role={b.level === 'exhausted' ? 'alert' : 'status'}
          data-budget={b.key}
        >
          <strong>{budgetTitle(b)}:</strong> {b.banner}
        </div>
      ))}
    </section>
  );
}

const STORAGE_KEY = 'gpulab:budget-notices';

function alreadyTold(): Set<string> {
  try {
    return new Set(JSON.parse(window.localStorage.getItem(STORAGE_KEY) ?? '[]') as string[]);
  } catch {
    return new Set();
  }
}

const budget: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-labextension:budget',
  description:
    "The GPU-hour budgets of the user's teams: a sidebar section and a notification at 80 % and 100 %.",
  autoStart: true,
  requires: [IGpuSidebar],
  activate: (app: JupyterFrontEnd, sidebar: IGpuSidebar) => {
    const model = new BudgetModel();
    sidebar.addSection('budget', () => <BudgetSection model={model} />, model.changed);
    // Toasts show only once the lab's notification plugin is up: tell after the lab is restored.
    const tell = (): void => {
      const told = alreadyTold();
      for (const b of budgetBanners(model.data)) {
        const key = noticeKey(b);
        if (!told.has(key)) {
          told.add(key);
          const notify = b.level === 'exhausted' ? Notification.error : Notification.warning;
          notify(`${budgetTitle(b)}: ${b.banner}`, { autoClose: false });
        }
      }
      try {
        window.localStorage.setItem(STORAGE_KEY, JSON.stringify([...told].slice(-50)));
      } catch {
        // private mode: the notification may come again next time
      }
    };
    void app.restored.then(() => {
      tell();
      model.changed.connect(tell);
    });
  }
};

export default budget;
