// One traced speech stream over HTTP for the Lab: POST /v1/audio/speech as raw pcm, read as it arrives.

import { apiError, authHeaders, httpUrl } from '../api.js';
import { readPcmBody } from '../pcm-body.js';

/** Speak `input` with the console's `fields`; `onAudio(samples, at)` per network read with audio (`at`:
 * performance.now()). Every step goes into `trace` under `lane`. Throws the server's error (ApiError). */
export async function streamSpeech({ fields, input, trace, lane, signal, onAudio }) {
  const body = { ...fields, input, response_format: 'pcm' };
  trace.add('sent', 'http', lane, 'POST /v1/audio/speech', body);
  const response = await fetch(httpUrl('v1/audio/speech'), {
    method: 'POST', signal, headers: { 'Content-Type': 'application/json', ...authHeaders() },
    body: JSON.stringify(body) });
  const headers = { model: response.headers.get('x-qwen3tts-model'), voice: response.headers.get('x-qwen3tts-voice') };
  trace.add('received', 'http', lane, `${response.status} ${response.ok ? 'headers' : 'error'}`, headers);
  if (!response.ok) {
    const error = await apiError(response);
    trace.add('received', 'http', lane, 'error', { message: error.message, code: error.code });
    throw error;
  }
  await readPcmBody(response, (samples, bytes) => {
    onAudio(samples, trace.add('received', 'http', lane, 'audio', { bytes }));
  });
  trace.add('received', 'http', lane, 'end', null);
}
