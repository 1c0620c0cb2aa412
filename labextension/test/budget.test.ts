import { describe, expect, it } from 'vitest';

import { budgetBanners, budgetTitle, IBudgetStatus, noticeKey } from '../src/budgetLogic';

function status(over: Partial<IBudgetStatus>): IBudgetStatus {
  return {
    key: 'team:vision',
    team: 'vision',
    gpu_hours: 10,
    period: 'month',
    at_limit: 'over-quota',
    period_start: '2026-11-30T23:00:00Z',
    period_end: '2026-12-31T23:00:00Z',
    time_zone: 'Europe/Berlin',
    used_gpu_hours: 8.2,
    percent: 82,
    level: 'warning',
    banner: 'Team vision has used 8.2 of its 10 GPU-hours for December 2026 (82 %).',
    ...over
  };
}

describe('budget banners', () => {
  it('shows budgets at 80 % or more, the most used first', () => {
    const data = {
      user: 'alice',
      time_zone: 'Europe/Berlin',
      budgets: [
        status({ key: 'team:nlp', percent: 10, level: 'ok' }),
        status({}),
        status({ key: 'user:vision/alice', percent: 104, level: 'exhausted' })
      ]
    };
    expect(budgetBanners(data).map(b => b.key)).toEqual(['user:vision/alice', 'team:vision']);
    expect(budgetBanners(null)).toEqual([]);
  });

  it('names the level and tells once per level and period', () => {
    expect(budgetTitle(status({}))).toBe('GPU-hour budget at 82 %');
    expect(budgetTitle(status({ level: 'exhausted', percent: 100 }))).toBe(
      'GPU-hour budget used up'
    );
    const a = noticeKey(status({}));
    expect(noticeKey(status({ percent: 85 }))).toBe(a);
    expect(noticeKey(status({ level: 'exhausted' }))).not.toBe(a);
    expect(noticeKey(status({ period_start: '2026-12-31T23:00:00Z' }))).not.toBe(a);
  });
});
