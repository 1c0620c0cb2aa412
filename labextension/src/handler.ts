import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { absenceOf, errorMessage, GPULabAPIError } from './errors';

export { errorMessage, GPULabAPIError } from './errors';

/**
 * Call the gpulab server extension: `endPoint` is relative to
 * `<base>/gpulab/api/` (e.g. `session`, `hub/jobs`). Errors are
 * {@link GPULabAPIError}s with the API's own message, or JupyterLab's
 * `NetworkError` when the server did not answer at all.
 */
export async function requestAPI<T>(endPoint = '', init: RequestInit = {}): Promise<T> {
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
    throw new GPULabAPIError(response.status, errorMessage(response.status, body), absenceOf(body));
  }
  return (body ? JSON.parse(body) : null) as T;
}
