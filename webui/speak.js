// "Speak": POST /v1/audio/speech with response_format pcm, played as the body streams in.

import { apiError, authHeaders } from './api.js';
import { SAMPLE_RATE, s16 } from './player.js';
import { clearError, player, showError } from './page.js';
import { finishRequest, gotAudio, newRequest } from './requests.js';
import { speechFields } from './voices.js';

let httpAbort = null;

/** Speak `text` with the pickers' fields as a new take. */
export async function speak(text) {
  clearError();
  player.newTake();
  const req = newRequest('speak', text);
  const fields = speechFields();
  const abort = (httpAbort = new AbortController());
  let response;
  try {
    response = await fetch('/v1/audio/speech', {
      method: 'POST', signal: abort.signal, headers: { 'Content-Type': 'application/json', ...authHeaders() },
      body: JSON.stringify({ ...fields, input: text, response_format: 'pcm' }) });
  } catch (e) {
    if (abort.signal.aborted) { finishRequest(req, 'cancelled'); return; }
    showError({ message: `The server could not be reached (${e.message}).` }, 'Network error');
    finishRequest(req, 'error');
    return;
  }
  if (!response.ok) {
    showError(await apiError(response));
    finishRequest(req, 'error');
    return;
  }
  const reader = response.body.getReader();
  let carry = null; // a sample split across two network reads
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      let bytes = value;
      if (carry) { bytes = new Uint8Array(carry.length + value.length); bytes.set(carry); bytes.set(value, carry.length); carry = null; }
      if (bytes.length % 2) { carry = bytes.slice(-1); bytes = bytes.subarray(0, bytes.length - 1); }
      if (bytes.length) gotAudio(req, s16(bytes), req.t0);
    }
  } catch (e) {
    if (abort.signal.aborted) { finishRequest(req, 'cancelled'); return; }
    showError({ message: `The audio stream broke off (${e.message}).` }, 'Synthesis failed');
    finishRequest(req, 'error');
    return;
  } finally {
    if (httpAbort === abort) httpAbort = null;
  }
  const wall = (performance.now() - req.t0) / 1000;
  finishRequest(req, 'complete', req.samples ? wall / (req.samples / SAMPLE_RATE) : null);
}

/** Abort the HTTP request in flight, if any (its row finishes as cancelled). */
export function cancelSpeak() {
  if (httpAbort) httpAbort.abort();
}
