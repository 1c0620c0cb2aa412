import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/**
 * An error answered by the gpulab API (or the hub behind it), carrying the
 * API's own message so the UI can show it as such.
 */
export class GPULabAPIError extends Error {
  constructor(
    readonly status: number,
    message: string
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
 * Call the gpulab server extension: `endPoint` is relative to
 * `<base>/gpulab/api/` (e.g. `session`, `hub/jobs`).
 */
export async function requestAPI<T>(
  endPoint = '',
  init: RequestInit = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'gpulab', 'api', endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const body = await response.text();
  if (!response.ok) {
    throw new GPULabAPIError(
      response.status,
      errorMessage(response.status, body)
    );
  }
  return (body ? JSON.parse(body) : null) as T;
}
