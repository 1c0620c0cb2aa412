import { describe, expect, it } from 'vitest';

import { wrapIndex } from '../src/modal';

describe('focus wraps at both ends of a modal dialog', () => {
  it('leaves the middle to the browser', () => {
    expect(wrapIndex(2, 5, false)).toBeNull();
    expect(wrapIndex(2, 5, true)).toBeNull();
  });
  it('goes from the last control to the first, and back', () => {
    expect(wrapIndex(4, 5, false)).toBe(0);
    expect(wrapIndex(0, 5, true)).toBe(4);
  });
  it('enters from outside at the first or last control', () => {
    expect(wrapIndex(-1, 5, false)).toBe(0);
    expect(wrapIndex(-1, 5, true)).toBe(4);
    expect(wrapIndex(-1, 0, false)).toBeNull();
  });
});
