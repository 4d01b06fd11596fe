// "Speak": POST /v1/audio/speech as SSE (pcm deltas and text-progress events), played as it streams
// in, the text highlighted as the player reaches the audio each progress event came with.

import { ApiError, apiError, authHeaders } from './api.js';
import { SAMPLE_RATE, s16 } from './player.js';
import { clearError, player, showError, spoken } from './page.js';
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
    response = await fetch('v1/audio/speech', {
      method: 'POST', signal: abort.signal, headers: { 'Content-Type': 'application/json', ...authHeaders() },
      body: JSON.stringify({ ...fields, input: text, response_format: 'pcm', stream_format: 'sse',
                             progress: true }) });
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
  spoken.reset(text);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = ''; // an event split across network reads
  let failed = null;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buffer += value;
      const events = buffer.split('\n\n');
      buffer = events.pop();
      for (const block of events) {
        const data = block.split('\n').find(line => line.startsWith('data: '));
        if (!data) continue;
        const event = JSON.parse(data.slice(6));
        if (event.type === 'speech.audio.delta') {
          gotAudio(req, s16(Uint8Array.from(atob(event.audio), c => c.charCodeAt(0))), req.t0);
        } else if (event.type === 'speech.progress') {
          spoken.add(event);
        } else if (event.type === 'speech.audio.done') {
          req.usage = event.usage;
        } else if (event.type === 'error') {
          failed = event;
        }
      }
    }
  } catch (e) {
    if (abort.signal.aborted) { finishRequest(req, 'cancelled'); return; }
    showError({ message: `The audio stream broke off (${e.message}).` }, 'Synthesis failed');
    finishRequest(req, 'error');
    return;
  } finally {
    if (httpAbort === abort) httpAbort = null;
  }
  if (failed) { // the engine failed part-way: the audio so far has played
    showError(new ApiError(failed.error.message, failed.error), 'Synthesis failed');
    finishRequest(req, 'error');
    return;
  }
  const wall = (performance.now() - req.t0) / 1000;
  finishRequest(req, 'complete', req.samples ? wall / (req.samples / SAMPLE_RATE) : null);
}

/** Abort the HTTP request in flight, if any (its row finishes as cancelled). */
export function cancelSpeak() {
  if (httpAbort) httpAbort.abort();
}
