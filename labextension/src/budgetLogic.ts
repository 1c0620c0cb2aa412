/**
 * GPU-hour budgets in the lab: what the hub's `GET /hub/api/gpulab/me/budgets` answers, and
 * which of them the sidebar shows (pure functions, tested without a browser).
 */

/** One budget as the hub describes it (hub_config/domain/budgets.py: status_dict). */
export interface IBudgetStatus {
  key: string;
  team: string;
  user?: string;
  gpu_hours: number;
  period: 'month' | 'week';
  at_limit: 'over-quota' | 'refuse';
  period_start: string;
  period_end: string;
  time_zone: string;
  used_gpu_hours: number;
  percent: number;
  level: 'ok' | 'warning' | 'exhausted';
  banner: string;
}

export interface IBudgets {
  user: string;
  time_zone: string;
  budgets: IBudgetStatus[];
}

/** The budgets worth a banner (80 % or more), the most used first. */
export function budgetBanners(data: IBudgets | null): IBudgetStatus[] {
  if (!data) {
    return [];
  }
  return data.budgets.filter(b => b.level !== 'ok').sort((a, b) => b.percent - a.percent);
}

/** "GPU-hour budget at 82 %" or "GPU-hour budget used up". */
export function budgetTitle(b: IBudgetStatus): string {
  return b.level === 'exhausted'
    ? 'GPU-hour budget used up'
    : `GPU-hour budget at ${String(Math.round(b.percent))} %`;
}

/** A key that changes when a budget reaches a new level in a new period: tell the user once. */
export function noticeKey(b: IBudgetStatus): string {
  return `${b.key}@${b.period_start}:${b.level}`;
}
