/**
 * A modal dialog's keyboard contract (the WAI-ARIA Authoring Practices' dialog
 * pattern, https://www.w3.org/WAI/ARIA/apg/patterns/dialog-modal/): Tab and
 * Shift+Tab move through every control of the dialog and wrap at its ends,
 * focus that leaves the dialog is brought back, Escape closes it, and on close
 * focus returns to where it was before. JupyterLab's own Dialog wraps only from
 * its last button to a control found before a React body has rendered, so the
 * job dialog uses this instead.
 */

/** Where Tab (or Shift+Tab with `back`) goes from `current` among `count` controls: the wrap, else null (the browser's order). */
export function wrapIndex(current: number, count: number, back: boolean): number | null {
  if (count === 0) {
    return null;
  }
  if (current < 0) {
    return back ? count - 1 : 0; // focus is on the dialog itself, or outside it
  }
  if (!back && current === count - 1) {
    return 0;
  }
  if (back && current === 0) {
    return count - 1;
  }
  return null;
}

const FOCUSABLE =
  'a[href], button, input, select, textarea, details > summary, [tabindex]:not([tabindex="-1"])';

/** The controls Tab reaches inside `root`, in document order (of a radio group, only the one Tab stops at). */
export function tabStops(root: HTMLElement): HTMLElement[] {
  const all = Array.from(root.querySelectorAll<HTMLElement>(FOCUSABLE)).filter(
    el =>
      !(el as HTMLInputElement).disabled &&
      el.tabIndex >= 0 &&
      el.getClientRects().length > 0 &&
      !el.closest('[inert]')
  );
  return all.filter(el => {
    const input = el as HTMLInputElement;
    if (input.type !== 'radio' || !input.name) {
      return true;
    }
    const group = all.filter(
      x => (x as HTMLInputElement).type === 'radio' && (x as HTMLInputElement).name === input.name
    ) as HTMLInputElement[];
    const stop = group.find(x => x.checked) ?? group[0];
    return stop === input;
  });
}

/**
 * Keep focus inside `root` while it is open; `onEscape` on Escape. Returns the
 * function that releases the trap and puts focus back where it was.
 */
export function trapFocus(root: HTMLElement, onEscape: () => void): () => void {
  const before = document.activeElement as HTMLElement | null;
  const onKeydown = (event: KeyboardEvent) => {
    if (event.key === 'Escape') {
      event.preventDefault();
      onEscape();
    } else if (event.key === 'Tab') {
      const stops = tabStops(root);
      const active = document.activeElement as HTMLElement | null;
      const current = active ? stops.indexOf(active) : -1;
      const next = wrapIndex(current, stops.length, event.shiftKey);
      if (next !== null) {
        event.preventDefault();
        stops[next].focus();
      }
    }
    // The dialog is modal: JupyterLab's shortcuts wait until it closes.
    event.stopPropagation();
  };
  const onFocusIn = (event: FocusEvent) => {
    if (!root.contains(event.target as Node)) {
      tabStops(root)[0]?.focus();
    }
  };
  root.addEventListener('keydown', onKeydown);
  document.addEventListener('focusin', onFocusIn, true);
  return () => {
    root.removeEventListener('keydown', onKeydown);
    document.removeEventListener('focusin', onFocusIn, true);
    if (before && before.isConnected) {
      before.focus();
    }
  };
}
