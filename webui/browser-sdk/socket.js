// WebSockets to the server: the key as a subprotocol (a browser cannot set headers on a WebSocket), JSON
// events and binary audio handed to callbacks; and the qtts.v1 protocol of /v1/ws (docs/protocols.md).

import { ApiError } from './errors.js';
import { socketUrl } from './urls.js';

const TOKEN_SAFE = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/; // what a WebSocket subprotocol may contain

/** A WebSocket (not yet open) to the server's socket `path`, offering `protocol`. The API key goes as the
 * subprotocol `keyProtocol + key` beside it, or as ?api_key= when it cannot be a subprotocol. Binary
 * messages arrive as ArrayBuffers. `WebSocket`: the implementation (default: the global one). */
export function openSocket(path, { baseUrl, apiKey, protocol, keyProtocol = 'bearer.', query = {},
  WebSocket: Impl = globalThis.WebSocket } = {}) {
  if (!Impl) throw new TypeError('no WebSocket here: pass options.WebSocket (Node 22 has one built in)');
  const asProtocol = Boolean(apiKey) && TOKEN_SAFE.test(apiKey);
  const url = socketUrl(path, baseUrl, { ...query, ...(apiKey && !asProtocol ? { api_key: apiKey } : {}) });
  const protocols = [protocol, ...(asProtocol ? [`${keyProtocol}${apiKey}`] : [])].filter(Boolean);
  const ws = new Impl(url.href, protocols);
  ws.binaryType = 'arraybuffer';
  return ws;
}

/** What every socket of the SDK shares: opening, JSON out, events and audio in, closing. */
export class SpeechSocket {
  constructor(ws) {
    this.ws = ws;
    /** Each JSON event from the server, as an object. */
    this.onevent = null;
    /** Each chunk of audio, as a Uint8Array (the bytes of the requested format). */
    this.onaudio = null;
    /** The socket closed: (code, reason). */
    this.onclose = null;
    /** The last `error` event's error object ({message, type, param, code}), if any. */
    this.lastError = null;
    this._waiters = new Set();
    this._opening = null;
    this.closed = new Promise((resolve) => { this._closedResolve = resolve; });
    ws.onmessage = (e) => {
      if (typeof e.data === 'string') this._event(JSON.parse(e.data));
      else this._audio(new Uint8Array(e.data));
    };
    ws.onerror = () => { /* onclose follows with the code */ };
    ws.onclose = (e) => {
      // a refusal (wrong key, too many sockets, ...) is an error event, then the close
      const why = this.lastError && e.code !== 1000 ? ApiError.fromEvent(this.lastError)
        : new Error(`the socket closed (${e.code}${e.reason ? `: ${e.reason}` : ''})`);
      if (this._opening) this._opening(why);
      for (const waiter of this._waiters) waiter.fail(why);
      this._waiters.clear();
      this._closedResolve({ code: e.code, reason: e.reason });
      if (this.onclose) this.onclose(e.code, e.reason);
    };
  }

  /** Resolves with `socket` once its WebSocket is open; rejects when it closes first. */
  static _opened(socket) {
    return new Promise((resolve, reject) => {
      socket._opening = reject;
      socket.ws.onopen = () => { socket._opening = null; resolve(socket); };
    });
  }

  get isOpen() { return this.ws.readyState === 1; }

  /** Send one JSON message. */
  send(message) { this.ws.send(JSON.stringify(message)); }

  /** Close (1000 by default); resolves with {code, reason} once closed. */
  close(code = 1000, reason = '') { this.ws.close(code, reason); return this.closed; }

  _event(event) {
    if (event.type === 'error') this.lastError = event.error;
    if (this.onevent) this.onevent(event);
    for (const waiter of [...this._waiters]) waiter.event(event);
  }

  _audio(bytes) {
    if (this.onaudio) this.onaudio(bytes);
    for (const waiter of [...this._waiters]) if (waiter.audio) waiter.audio(bytes);
  }

  /** Wait for the event `until(event)` accepts (it may throw to reject); `onEvent` sees every event
   * meanwhile, `onAudio` every chunk. */
  _wait(until, { onEvent = null, onAudio = null } = {}) {
    return new Promise((resolve, reject) => {
      const waiter = {
        event: (event) => {
          try {
            if (onEvent) onEvent(event);
            if (until(event)) { this._waiters.delete(waiter); resolve(event); }
          } catch (e) { this._waiters.delete(waiter); reject(e); }
        },
        audio: onAudio,
        fail: reject,
      };
      this._waiters.add(waiter);
    });
  }
}

/** The qtts.v1 socket, /v1/ws: live text in, audio out; utterances one after another on one socket. */
export class QttsSocket extends SpeechSocket {
  /** Open /v1/ws. `options`: baseUrl (default: the page's folder), apiKey, WebSocket. */
  static connect(options = {}) {
    return SpeechSocket._opened(new QttsSocket(openSocket('v1/ws', { ...options, protocol: 'qtts.v1' })));
  }

  /** Open an utterance: the speech request's fields (voice, model, language, seed, format, progress, ...). */
  start(fields = {}) { this.send({ type: 'start', format: 'pcm', ...fields }); }

  /** More text (any size; `seq` for resumable utterances). */
  text(text, seq) { this.send(seq == null ? { type: 'text', text } : { type: 'text', text, seq }); }

  /** No more text: speak what came. */
  stop() { this.send({ type: 'stop' }); }

  /** Stop now; audio not yet sent is dropped. */
  cancel() { this.send({ type: 'cancel' }); }

  /** Audio bytes received so far (resumable utterances). */
  ack(audioBytes) { this.send({ type: 'ack', audio_bytes: audioBytes }); }

  /** Speak `text` as one utterance; resolves with its `done` event once every chunk went to `onAudio`
   * (and `onaudio`). A refused start rejects with the server's ApiError. */
  async speak(text, fields = {}, { onAudio = null, onEvent = null } = {}) {
    let started = false;
    const done = this._wait((event) => {
      if (event.type === 'error' && !started) throw ApiError.fromEvent(event.error);
      if (event.type === 'started') {
        started = true;
        this.text(text);
        this.stop();
      }
      return event.type === 'done';
    }, { onEvent, onAudio });
    this.start(fields);
    return done;
  }
}
