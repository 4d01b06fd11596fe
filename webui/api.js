// Calls to the server: the API key as a Bearer header, OpenAI-style error envelopes as ApiError. URLs and
// sockets come from the browser SDK (browser-sdk/), relative to the page: right under a proxy's path prefix.

import { ApiError, apiError, httpUrl, openSocket as openKeyedSocket } from './browser-sdk/index.js';
import { $ } from './page.js';

export { ApiError, apiError, httpUrl };

export const apiKey = () => $('api-key').value.trim();
export const authHeaders = () => (apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {});

/** A WebSocket to `path` (on this server, under its prefix) offering `subprotocol`; the key travels as the
 * subprotocol `bearer.KEY` (browsers cannot set headers here), or as ?api_key= when it cannot be one. Binary
 * messages come as ArrayBuffers. */
export function openSocket(path, subprotocol) {
  return openKeyedSocket(path, { protocol: subprotocol, apiKey: apiKey() });
}

export async function getJSON(path) {
  const response = await fetch(httpUrl(path), { headers: authHeaders() });
  if (!response.ok) throw await apiError(response);
  return response.json();
}
