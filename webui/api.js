// Calls to the server: the API key as a Bearer header, OpenAI-style error envelopes as ApiError.

import { $ } from './page.js';

export class ApiError extends Error {
  constructor(message, { status = null, code = null, type = null, param = null } = {}) {
    super(message);
    Object.assign(this, { status, code, type, param });
  }
}

/** The error a failed response carries (`{"error": {message, code, param, type}}`), or its status line. */
export async function apiError(response) {
  let body = null;
  try { body = await response.json(); } catch { /* not JSON */ }
  const e = body && body.error;
  if (e && e.message) return new ApiError(e.message, { status: response.status, ...e });
  return new ApiError(`${response.status} ${response.statusText || 'error'}`, { status: response.status });
}

export const apiKey = () => $('api-key').value.trim();
export const authHeaders = () => (apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {});

export async function getJSON(path) {
  const response = await fetch(path, { headers: authHeaders() });
  if (!response.ok) throw await apiError(response);
  return response.json();
}
