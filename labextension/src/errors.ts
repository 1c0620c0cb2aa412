/**
 * Errors of the gpulab API, free of JupyterLab imports so that the model and
 * its unit tests can use them.
 */

/** Why the GPU panel has nothing to show, when that is the case. */
export type Absence = 'no-gpulab' | 'no-hub' | 'no-extension';

/**
 * An error answered by the gpulab API (or the hub behind it), carrying the
 * API's own message so the UI can show it as such.
 */
export class GPULabAPIError extends Error {
  constructor(
    readonly status: number,
    message: string,
    /** Set when the answer says gpulab is not there at all (see {@link absenceOf}). */
    readonly absence: Absence | null = null
  ) {
    super(message);
    this.name = 'GPULabAPIError';
  }
}

/** The message of a JSON error body `{"status", "message"}`, or a fallback. */
export function errorMessage(status: number, body: string): string {
  try {
    const data = JSON.parse(body);
    if (data && typeof data.message === 'string' && data.message) {
      return data.message;
    }
  } catch {
    // not JSON: fall through
  }
  const text = body.trim();
  return text && text.length < 300 && !text.startsWith('<')
    ? text
    : `request failed with HTTP ${status}`;
}

/**
 * Does this error answer of the server extension say gpulab is absent? It
 * sets `"absent": "no-gpulab"` when the hub has no gpulab API, and
 * `"absent": "no-hub"` when the server does not run under JupyterHub. (A
 * missing server extension shows as a 404 of `session`: see the model.)
 */
export function absenceOf(body: string): Absence | null {
  try {
    const data = JSON.parse(body);
    if (data && (data.absent === 'no-gpulab' || data.absent === 'no-hub')) {
      return data.absent;
    }
  } catch {
    // not JSON
  }
  return null;
}

/** The sentence the panel shows instead of data when gpulab is absent. */
export function absenceSentence(absence: Absence): string {
  switch (absence) {
    case 'no-gpulab':
      return 'This hub does not run gpulab; the GPU panel has nothing to show.';
    case 'no-hub':
      return 'This server does not run under JupyterHub, so there is no gpulab to ask; the GPU panel has nothing to show.';
    case 'no-extension':
      return 'The gpulab server extension is not enabled on this server; the GPU panel has nothing to show.';
  }
}

export function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
