/**
 * Standby while the tab is hidden, with Lumino's own visibility tracking: a
 * minimal `document` is installed before @lumino/polling is loaded.
 */
import { afterAll, describe, expect, it, vi } from 'vitest';

import { FakeClient } from './fakeClient';

const listeners: Record<string, (() => void)[]> = {};
const fakeDocument = {
  visibilityState: 'visible',
  addEventListener: (name: string, fn: () => void) => (listeners[name] ??= []).push(fn)
};
(globalThis as unknown as { document: unknown }).document = fakeDocument;

function setVisibility(state: 'visible' | 'hidden'): void {
  fakeDocument.visibilityState = state;
  for (const fn of listeners.visibilitychange ?? []) {
    fn();
  }
}

afterAll(() => {
  delete (globalThis as unknown as { document?: unknown }).document;
});

describe('GpuStatusModel standby', () => {
  it('stops asking while the tab is hidden and resumes when it shows', async () => {
    vi.useFakeTimers();
    const { GpuStatusModel } = await import('../src/model');
    const client = new FakeClient();
    const model = new GpuStatusModel({ client, interval: 1000, maxInterval: 8000 });
    await vi.advanceTimersByTimeAsync(2010);
    expect(client.count('session')).toBe(3);
    setVisibility('hidden');
    await vi.advanceTimersByTimeAsync(10 * 1000);
    // Lumino lingers one tick after the tab hides, then stands by.
    expect(client.count('session')).toBe(4);
    setVisibility('visible');
    await vi.advanceTimersByTimeAsync(1000);
    expect(client.count('session')).toBe(5);
    model.dispose();
    vi.useRealTimers();
  });
});
