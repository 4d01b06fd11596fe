// Qwen3-TTS-X console: pickers from the API, "Speak" over POST /v1/audio/speech (pcm, streamed with
// fetch), "Speak as I type" over the WebSocket /v1/ws, playback and live view from player.js.
// Tests read window.__qtts (samples scheduled, chunks, time to first audio, requests, errors).

import { Player, SAMPLE_RATE, Scope, s16, wavBlob } from './player.js';

const $ = (id) => document.getElementById(id);

const stats = {
  ready: false,          // models and voices loaded
  scheduledSamples: 0,   // every sample handed to the AudioContext
  chunks: 0,
  underruns: 0,
  ttfaMs: null,          // of the latest request
  rtf: null,
  requests: [],          // one entry per request (see newRequest)
  errors: [],            // every error shown
  events: [],            // WebSocket JSON events, in order
  live: { state: 'off', sentChars: 0, charsAtFirstAudio: null },
  audioContext: null,
};
window.__qtts = stats;

const player = new Player(stats);
new Scope($('scope'), player);

// The official Qwen3-TTS languages; a model card that lists its own (`languages`) wins.
const LANGUAGES = ['auto', 'english', 'chinese', 'japanese', 'korean', 'german', 'french', 'russian',
  'portuguese', 'spanish', 'italian'];
const TOKEN_SAFE = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/; // what a WebSocket subprotocol may contain
const store = {
  get: (k) => { try { return localStorage.getItem(`qtts.${k}`); } catch { return null; } },
  set: (k, v) => { try { localStorage.setItem(`qtts.${k}`, v); } catch { /* private mode */ } },
};

// -- errors: always shown, never swallowed ------------------------------------------------------

class ApiError extends Error {
  constructor(message, { status = null, code = null, type = null, param = null } = {}) {
    super(message);
    Object.assign(this, { status, code, type, param });
  }
}

async function apiError(response) {
  let body = null;
  try { body = await response.json(); } catch { /* not JSON */ }
  const e = body && body.error;
  if (e && e.message) return new ApiError(e.message, { status: response.status, ...e });
  return new ApiError(`${response.status} ${response.statusText || 'error'}`, { status: response.status });
}

function showError(error, title = 'Server error') {
  const code = [error.status, error.code, error.param && `param: ${error.param}`].filter(Boolean).join(' · ');
  $('error-title').textContent = title;
  $('error-message').textContent = error.message || String(error);
  $('error-code').textContent = code;
  $('error-code').hidden = !code;
  $('error').hidden = false;
  stats.errors.push({ title, message: error.message || String(error), code: error.code || null,
    status: error.status || null });
  if (error.status === 401) $('api-key').focus();
}

function clearError() { $('error').hidden = true; }

$('error-close').addEventListener('click', clearError);
window.addEventListener('error', (e) => showError({ message: e.message }, 'Page error'));
window.addEventListener('unhandledrejection', (e) => showError({ message: String(e.reason?.message ?? e.reason) },
  'Page error'));

// -- API ----------------------------------------------------------------------------------------

const apiKey = () => $('api-key').value.trim();
const authHeaders = () => (apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {});

async function getJSON(path) {
  const response = await fetch(path, { headers: authHeaders() });
  if (!response.ok) throw await apiError(response);
  return response.json();
}

// -- models, voices, languages, instructions ----------------------------------------------------

const cards = new Map();        // model id -> /v1/models card (plus `type` from /ready)
const learned = new Map();      // model id -> false once the server said it ignored instructions

async function refreshStatus() {
  try {
    const response = await fetch('/ready');
    const body = await response.json();
    if (!response.ok) throw new ApiError(body.error?.message || 'not ready');
    const active = body.models.reduce((n, m) => n + m.active, 0);
    const waiting = body.models.reduce((n, m) => n + m.waiting, 0);
    setPill($('server-status'), `ready · ${body.models.length} model${body.models.length > 1 ? 's' : ''} · ${active} active${waiting ? ` · ${waiting} waiting` : ''}`, 'ok');
    for (const m of body.models) cards.set(m.id, { ...(cards.get(m.id) || {}), type: m.type });
  } catch (e) {
    setPill($('server-status'), `not ready: ${e.message}`, 'bad');
  }
}

function setPill(el, text, tone) {
  el.textContent = text;
  el.dataset.tone = tone || '';
}

async function loadModels() {
  stats.ready = false;
  try {
    await refreshStatus();
    const { data } = await getJSON('/v1/models');
    const served = data.filter((m) => m.root === m.id); // aliases (tts-1, ...) name the default
    const select = $('model');
    const previous = select.value || store.get('model');
    select.replaceChildren(...served.map((m) => new Option(m.id, m.id)));
    for (const m of served) cards.set(m.id, { ...(cards.get(m.id) || {}), ...m });
    if (served.some((m) => m.id === previous)) select.value = previous;
    await loadVoices();
    clearError();
    stats.ready = true;
  } catch (e) {
    showError(e, e.status === 401 ? 'API key needed' : 'Could not load the models');
  }
}

function modelType(id, voices) {
  const card = cards.get(id) || {};
  if (card.model_type || card.type) return card.model_type || card.type;
  if (voices.some((v) => v.kind === 'speaker')) return 'custom_voice';
  return voices.some((v) => v.kind === 'openai') ? 'voice_design' : 'base';
}

/** true, false, or null (unknown: the field stays open and the server's answer teaches us). */
function takesInstructions(id, type) {
  const card = cards.get(id) || {};
  if (typeof card.instruct_supported === 'boolean') return card.instruct_supported;
  if (learned.has(id)) return learned.get(id);
  if (type === 'voice_design') return true;
  if (type === 'base') return false; // a cloned voice speaks as recorded
  if (/(^|[^0-9.])0\.6b/i.test(id)) return false; // the 0.6B models cannot take instructions
  return type === 'custom_voice' ? true : null;
}

async function loadVoices() {
  const model = $('model').value;
  store.set('model', model);
  const { voices } = await getJSON(`/v1/audio/voices?model=${encodeURIComponent(model)}`);
  const type = modelType(model, voices);
  const select = $('voice');
  const previous = select.value || store.get('voice');
  const groups = [['speaker', 'Speakers'], ['openai', 'OpenAI voice names'], ['profile', 'Saved voices']];
  select.replaceChildren(...groups.map(([kind, label]) => {
    const group = document.createElement('optgroup');
    group.label = label;
    for (const v of voices.filter((x) => x.kind === kind)) {
      const detail = kind === 'speaker' ? [v.language, v.gender].filter(Boolean).join(', ')
        : kind === 'openai' ? (v.speaker ? `→ ${v.speaker}` : '') : '';
      const option = new Option(detail ? `${v.name} — ${detail}` : v.name, v.id);
      option.title = v.description || '';
      option.dataset.language = v.language || '';
      group.append(option);
    }
    return group;
  }).filter((g) => g.children.length));
  if ([...select.options].some((o) => o.value === previous)) select.value = previous;
  const card = cards.get(model) || {};
  const languages = card.languages ? ['auto', ...Object.keys(card.languages)] : LANGUAGES;
  const language = $('language');
  const lang = language.value || store.get('language') || 'auto';
  language.replaceChildren(...languages.map((l) => new Option(l[0].toUpperCase() + l.slice(1).replace('_', ' '), l)));
  language.value = languages.includes(lang) ? lang : 'auto';
  updateInstructions(model, type);
}

function updateInstructions(model = $('model').value, type = (cards.get(model) || {}).type) {
  const takes = takesInstructions(model, type);
  const field = $('instructions');
  $('voice').disabled = type === 'voice_design';
  $('instructions-field').hidden = takes === false && type === 'base';
  field.disabled = takes === false;
  $('instructions-label').textContent = type === 'voice_design' ? 'Voice description' : 'Instructions';
  field.placeholder = type === 'voice_design' ? 'e.g. A calm, deep male voice with a slight rasp.'
    : 'e.g. Speak slowly and warmly.';
  $('instructions-note').textContent = type === 'voice_design'
    ? 'VoiceDesign model: the description is the voice (an OpenAI voice name stands in when empty).'
    : takes === false ? 'This model cannot take instructions.'
      : takes === null ? 'Instructions are ignored where the model cannot take them.' : '';
}

$('model').addEventListener('change', () => loadVoices().catch((e) => showError(e, 'Could not load the voices')));
$('voice').addEventListener('change', () => store.set('voice', $('voice').value));
$('language').addEventListener('change', () => store.set('language', $('language').value));
$('api-key').value = store.get('apiKey') || '';
$('api-key').addEventListener('change', () => { store.set('apiKey', apiKey()); closeSocket(); loadModels(); });

/** The request fields the pickers and sampling controls say (shared by HTTP and WebSocket). */
function speechFields() {
  const fields = { model: $('model').value, voice: $('voice').value, language: $('language').value };
  const instructions = $('instructions').value.trim();
  if (instructions && !$('instructions').disabled) fields.instructions = instructions;
  const numbers = [['seed', 'seed', parseInt], ['max-frames', 'max_frames', parseInt],
    ['temperature', 'temperature', parseFloat], ['top-k', 'top_k', parseInt], ['top-p', 'top_p', parseFloat],
    ['repetition-penalty', 'repetition_penalty', parseFloat], ['speed', 'speed', parseFloat]];
  for (const [id, name, parse] of numbers) {
    const raw = $(id).value.trim();
    if (raw !== '' && !Number.isNaN(parse(raw))) fields[name] = parse(raw);
  }
  if (fields.speed === 1) delete fields.speed;
  return fields;
}

function noteInstructionsIgnored(model, ignored) {
  if (!ignored) return;
  learned.set(model, false);
  updateInstructions();
}

// -- requests: history and figures ---------------------------------------------------------------

function newRequest(mode, text) {
  const req = { n: stats.requests.length + 1, mode, model: $('model').value, voice: $('voice').value,
    text, t0: performance.now(), firstTextAt: null, ttfaMs: null, samples: 0, chunks: 0, rtf: null,
    finish: 'running', usage: null };
  stats.requests.push(req);
  $('history-empty').hidden = true;
  const row = document.createElement('tr');
  row.id = `req-${req.n}`;
  $('history').tBodies[0].prepend(row);
  renderRequest(req);
  return req;
}

const ms = (v) => (v == null ? '—' : `${Math.round(v)} ms`);
const secs = (samples) => `${(samples / SAMPLE_RATE).toFixed(2)} s`;

function renderRequest(req) {
  const row = $(`req-${req.n}`);
  const cells = [req.n, req.mode === 'live' ? 'typing' : 'speak', req.voice,
    req.text.length > 48 ? `${req.text.slice(0, 47)}…` : req.text, ms(req.ttfaMs), secs(req.samples),
    req.rtf == null ? '—' : req.rtf.toFixed(2), req.finish];
  row.replaceChildren(...cells.map((c) => { const td = document.createElement('td'); td.textContent = c; return td; }));
  row.lastChild.dataset.finish = req.finish;
  row.children[3].title = req.text;
  $('ttfa').textContent = ms(req.ttfaMs);
  $('rtf').textContent = req.rtf == null ? '—' : `${req.rtf.toFixed(2)}×`;
  $('audio-len').textContent = secs(req.samples);
  $('chunks').textContent = String(req.chunks);
  $('download').disabled = player.takeSamples === 0;
}

function gotAudio(req, pcm, since) {
  if (req.ttfaMs == null) {
    req.ttfaMs = performance.now() - since;
    stats.ttfaMs = req.ttfaMs;
  }
  player.enqueue(pcm);
  req.samples += pcm.length;
  req.chunks++;
  renderRequest(req);
}

function finishRequest(req, finish, rtf = null) {
  if (req.finish !== 'running') return;
  req.finish = finish;
  req.rtf = rtf;
  if (rtf != null) stats.rtf = rtf;
  renderRequest(req);
  refreshStatus();
}

// -- "Speak": POST /v1/audio/speech, pcm read as it streams --------------------------------------

let httpAbort = null;

async function speak() {
  const text = $('text').value;
  if (!text.trim()) { showError({ message: 'Type some text first.' }, 'Nothing to say'); return; }
  stopAll();
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
  noteInstructionsIgnored(fields.model, response.headers.get('x-qwen3tts-instructions-ignored') === 'true');
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

// -- "Speak as I type": the WebSocket ---------------------------------------------------------------
// idle -> starting (start sent) -> speaking (started) -> stopping (stop sent) -> idle (done)
// Text typed while starting or stopping waits in `pending`; it opens the next utterance after `done`.

const live = { ws: null, connecting: null, state: 'idle', sent: '', pending: '', timer: null, req: null,
  stopAfterStart: false };

function setLiveState(state) {
  live.state = state;
  stats.live.state = liveOn() ? state : 'off';
  const pill = $('live-state');
  pill.hidden = !liveOn();
  setPill(pill, state, { speaking: 'ok', starting: 'busy', stopping: 'busy', cancelling: 'busy' }[state] || '');
}

const liveOn = () => $('live-mode').checked;

function socketUrl() {
  const key = apiKey();
  const query = key && !TOKEN_SAFE.test(key) ? `?api_key=${encodeURIComponent(key)}` : '';
  return `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/v1/ws${query}`;
}

function connect() {
  if (live.ws && live.ws.readyState === WebSocket.OPEN) return Promise.resolve(live.ws);
  if (live.connecting) return live.connecting;
  const key = apiKey();
  // the key travels as a subprotocol (browsers cannot set headers here), or as ?api_key= when it cannot
  const ws = new WebSocket(socketUrl(), key && TOKEN_SAFE.test(key) ? ['qtts.v1', `bearer.${key}`] : ['qtts.v1']);
  ws.binaryType = 'arraybuffer';
  live.connecting = new Promise((resolve, reject) => {
    ws.onopen = () => { live.ws = ws; live.connecting = null; resolve(ws); };
    ws.onerror = () => { /* onclose follows with the code */ };
    ws.onclose = (e) => {
      live.connecting = null;
      if (live.ws === ws) live.ws = null;
      const wasBusy = live.state !== 'idle';
      if (e.code !== 1000 && e.code !== 1005 && (wasBusy || !ws.sawError)) {
        showError({ message: `The WebSocket closed (code ${e.code}${e.reason ? `: ${e.reason}` : ''}).` }, 'Connection lost');
      }
      if (live.req) finishRequest(live.req, 'error');
      live.req = null;
      live.pending = '';
      setLiveState('idle');
      reject(new Error(`WebSocket closed (${e.code})`));
    };
  });
  ws.onmessage = (e) => {
    if (typeof e.data === 'string' && e.data.includes('"type":"error"')) ws.sawError = true;
    onSocketMessage(e.data);
  };
  live.connecting.catch(() => {});
  return live.connecting;
}

function closeSocket() {
  if (live.ws) live.ws.close(1000);
  live.ws = null;
}

function sendJSON(message) {
  if (live.ws && live.ws.readyState === WebSocket.OPEN) live.ws.send(JSON.stringify(message));
}

function onSocketMessage(data) {
  const req = live.req;
  if (typeof data !== 'string') {
    if (!req || live.state === 'cancelling') return; // audio of a cancelled utterance
    if (req.ttfaMs == null) stats.live.charsAtFirstAudio = stats.live.sentChars;
    gotAudio(req, s16(new Uint8Array(data)), req.firstTextAt ?? req.t0);
    return;
  }
  const event = JSON.parse(data);
  stats.events.push(event);
  if (event.type === 'started') {
    setLiveState('speaking');
    noteInstructionsIgnored(event.model, event.instructions_ignored);
    if (live.pending) sendText(live.pending);
    live.pending = '';
    if (live.stopAfterStart) finishLive();
  } else if (event.type === 'error') {
    showError(new ApiError(event.error.message, event.error));
    if (live.state === 'starting') { // the start was refused: nothing runs, the typed text is dropped
      if (req) { req.text = live.pending; finishRequest(req, 'error'); }
      live.req = null;
      live.pending = '';
      setLiveState('idle');
    }
  } else if (event.type === 'done') {
    if (req) {
      req.usage = event.usage;
      const compute = event.timings && event.timings.compute_s;
      finishRequest(req, event.finish_reason, event.audio_s ? compute / event.audio_s : null);
    }
    live.req = null;
    setLiveState('idle');
    if (liveOn() && live.pending.trim()) startLive();
  }
}

async function startLive() {
  clearError();
  player.newTake();
  live.req = newRequest('live', '');
  live.stopAfterStart = false;
  setLiveState('starting');
  try {
    const ws = await connect();
    ws.send(JSON.stringify({ type: 'start', format: 'pcm', ...speechFields() }));
  } catch (e) {
    if (live.req) { showError({ message: e.message }, 'Connection failed'); finishRequest(live.req, 'error'); }
    live.req = null;
    setLiveState('idle');
  }
}

function sendText(text) {
  const req = live.req;
  if (req.firstTextAt == null) req.firstTextAt = performance.now();
  req.text += text;
  stats.live.sentChars += text.length;
  renderRequest(req);
  sendJSON({ type: 'text', text });
}

function addDelta(delta) {
  if (live.state === 'speaking') { sendText(delta); return; }
  live.pending += delta;
  if (live.state === 'idle' && live.pending.trim()) startLive();
}

/** Finish speaking what was typed (a pause, Enter, or leaving typing mode). */
function finishLive() {
  clearTimeout(live.timer);
  if (live.state === 'speaking') { setLiveState('stopping'); sendJSON({ type: 'stop' }); }
  else if (live.state === 'starting') live.stopAfterStart = true;
}

$('text').addEventListener('input', () => {
  if (!liveOn()) return;
  const value = $('text').value;
  let common = 0; // text edited behind the end cannot be taken back: only what is new is spoken
  while (common < live.sent.length && common < value.length && live.sent[common] === value[common]) common++;
  const delta = value.slice(common);
  live.sent = value;
  if (delta) addDelta(delta);
  clearTimeout(live.timer);
  const pause = Math.max(200, parseInt($('pause-ms').value, 10) || 1200);
  live.timer = setTimeout(finishLive, pause);
});

$('text').addEventListener('keydown', (e) => {
  if (liveOn() && e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); finishLive(); }
});

$('live-mode').addEventListener('change', () => {
  live.sent = $('text').value; // what is already there is not spoken; new typing is
  live.pending = '';
  document.body.classList.toggle('live', liveOn());
  if (liveOn()) { player.ensure(); connect().catch(() => {}); $('text').focus(); } else finishLive();
  setLiveState(live.state);
});

// -- buttons ------------------------------------------------------------------------------------------

function stopAll() {
  if (httpAbort) httpAbort.abort();
  if (['starting', 'speaking', 'stopping'].includes(live.state)) {
    live.pending = '';
    setLiveState('cancelling');
    sendJSON({ type: 'cancel' });
  }
  player.stop();
  renderDownload();
}

function renderDownload() { $('download').disabled = player.takeSamples === 0; }

$('speak').addEventListener('click', () => { player.ensure(); speak(); });
$('stop').addEventListener('click', stopAll);
$('download').addEventListener('click', () => {
  const samples = player.heard();
  const link = document.createElement('a');
  link.href = URL.createObjectURL(wavBlob(samples));
  link.download = `qwen3-tts-${new Date().toISOString().replace(/[:.]/g, '-')}.wav`;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
});

document.body.classList.toggle('live', liveOn());
setLiveState('idle');
loadModels();
