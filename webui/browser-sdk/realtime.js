// OpenAI's Realtime API (GA) for speech, /v1/realtime (docs/protocols.md): a session, text in, audio out
// as `response.output_audio.delta` events, whose base64 audio goes to `onaudio` as bytes.

import { ApiError } from './errors.js';
import { SpeechSocket, openSocket } from './socket.js';

/** base64 -> Uint8Array. */
export function fromBase64(text) {
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

/** The socket of OpenAI's Realtime API: sessions, responses, and the live text buffer extension. */
export class RealtimeSocket extends SpeechSocket {
  /** Open /v1/realtime. `options`: baseUrl (default: the page's folder), apiKey, model (this server's model
   * id or alias; default: its default model), WebSocket. Resolves once open (the server then sends
   * `session.created`). */
  static connect(options = {}) {
    const ws = openSocket('v1/realtime', { ...options, protocol: 'realtime', keyProtocol: 'openai-insecure-api-key.',
      query: options.model ? { model: options.model } : {} });
    return SpeechSocket._opened(new RealtimeSocket(ws));
  }

  _event(event) {
    if (event.type === 'response.output_audio.delta') this._audio(fromBase64(event.delta));
    super._event(event);
  }

  /** `session.update` (`session.type` "realtime" is added): audio.output.voice / format / speed,
   * instructions, and this server's extensions (language, seed, ...). Resolves with `session.updated`. */
  updateSession(session) {
    const updated = this._wait((event) => {
      if (event.type === 'error') throw ApiError.fromEvent(event.error);
      return event.type === 'session.updated';
    });
    this.send({ type: 'session.update', session: { type: 'realtime', ...session } });
    return updated;
  }

  /** Add `text` as a user message and speak it (`response.create`); resolves with `response.done` once
   * its audio went to `onAudio` (and `onaudio`). A refused request rejects with the server's ApiError. */
  speak(text, { onAudio = null, onEvent = null, response = null } = {}) {
    const done = this._wait((event) => {
      if (event.type === 'error') throw ApiError.fromEvent(event.error);
      return event.type === 'response.done';
    }, { onEvent, onAudio });
    this.send({ type: 'conversation.item.create',
      item: { type: 'message', role: 'user', content: [{ type: 'input_text', text }] } });
    this.send(response ? { type: 'response.create', response } : { type: 'response.create' });
    return done;
  }

  /** Live text (the `input_text_buffer` extension): the first append opens a response that speaks the text
   * as it comes; `commit()` ends it. */
  append(delta) { this.send({ type: 'input_text_buffer.append', delta }); }

  commit() { this.send({ type: 'input_text_buffer.commit' }); }

  /** End the running response (status `cancelled`). */
  cancel() { this.send({ type: 'response.cancel' }); }
}
