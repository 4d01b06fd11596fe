// The server's errors as JavaScript sees them: OpenAI's envelope {"error": {message, type, param, code}},
// from an HTTP response or a socket's `error` event.

export class ApiError extends Error {
  constructor(message, { status = null, code = null, type = null, param = null } = {}) {
    super(message);
    this.name = 'ApiError';
    Object.assign(this, { status, code, type, param });
  }

  /** From a socket event's `error` object ({message, type, param, code}). */
  static fromEvent(error) {
    return new ApiError(error?.message || 'server error', error || {});
  }
}

/** The error a failed fetch Response carries (its envelope), or its status line. */
export async function apiError(response) {
  let body = null;
  try { body = await response.json(); } catch { /* not JSON */ }
  const e = body && body.error;
  if (e && e.message) return new ApiError(e.message, { status: response.status, ...e });
  return new ApiError(`${response.status} ${response.statusText || 'error'}`, { status: response.status });
}
