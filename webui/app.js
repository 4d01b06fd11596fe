// Qwen3-TTS-X console: pickers from the API, "Speak" over POST /v1/audio/speech (pcm, streamed with
// fetch), "Speak as I type" over the WebSocket /v1/ws, playback and live view from player.js.
// Tests read window.__qtts (samples scheduled, chunks, time to first audio, requests, errors).

import { SpokenText } from './highlight.js';
import { Player, SAMPLE_RATE, Scope, s16, wavBlob } from './player.js';
import { Recorder } from './recorder.js';

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
  progress: null,        // the last text-progress event shown (typing mode)
  live: { state: 'off', sentChars: 0, charsAtFirstAudio: null },
  voices: { created: [], deleted: [] }, // POST / DELETE /v1/audio/voices that succeeded
  recording: { state: 'idle', seconds: 0 },
  audioContext: null,
};
window.__qtts = stats;

const player = new Player(stats);
new Scope($('scope'), player);
const spoken = new SpokenText($('spoken'), player, stats); // typing mode: the text as it is spoken

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
// The model cards (/v1/models) say what each model is and can do (model_type, instruct_supported,
// languages, speakers); /v1/audio/voices lists every voice once: speakers and OpenAI names with the
// models that have them, and the saved voice profiles with the Base models they speak with.

const cards = new Map();        // served model id -> its /v1/models card
let voices = [];                // GET /v1/audio/voices

async function refreshStatus() {
  try {
    const response = await fetch('/ready');
    const body = await response.json();
    if (!response.ok) throw new ApiError(body.error?.message || 'not ready');
    const active = body.models.reduce((n, m) => n + m.active, 0);
    const waiting = body.models.reduce((n, m) => n + m.waiting, 0);
    setPill($('server-status'), `ready · ${body.models.length} model${body.models.length > 1 ? 's' : ''} · ${active} active${waiting ? ` · ${waiting} waiting` : ''}`, 'ok');
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
    cards.clear();
    for (const m of served) cards.set(m.id, m);
    const select = $('model');
    const previous = select.value || store.get('model');
    select.replaceChildren(...served.map((m) => {
      const option = new Option(m.id, m.id);
      option.title = `${TYPE_NAMES[m.model_type] || m.model_type} · ${m.model_size}`;
      return option;
    }));
    if (served.some((m) => m.id === previous)) select.value = previous;
    await loadVoices();
    renderNewVoice();
    clearError();
    stats.ready = true;
  } catch (e) {
    showError(e, e.status === 401 ? 'API key needed' : 'Could not load the models');
  }
}

const TYPE_NAMES = { custom_voice: 'CustomVoice', voice_design: 'VoiceDesign', base: 'Base (cloning)' };
const MODES = { icl: 'in-context clone', xvector: 'x-vector clone' };

/** Fetch the voice list, then show the picker with `select` (a voice id) selected if given. */
async function loadVoices(select = null) {
  ({ voices } = await getJSON('/v1/audio/voices'));
  renderVoices(select);
}

const selectedVoice = () => voices.find((v) => v.id === $('voice').value) || null;

/** The model a request goes to: the picked one, or the Base model of a picked voice profile. */
function effectiveModel() {
  const voice = selectedVoice();
  if (voice && voice.kind === 'profile' && voice.models.length) return voice.models[0];
  return $('model').value;
}

function renderVoices(preferred = null) {
  const model = $('model').value;
  store.set('model', model);
  const select = $('voice');
  const before = select.value;
  const previous = preferred || before || store.get('voice');
  const groups = [
    ['speaker', 'Built-in speakers', (v) => v.models.includes(model)],
    ['openai', 'OpenAI voice names', (v) => v.models.includes(model)],
    ['profile', 'Your voices (cloned)', () => true], // a profile speaks with its own Base model
  ];
  const built = groups.map(([kind, label, fits]) => {
    const group = document.createElement('optgroup');
    group.label = label;
    group.dataset.kind = kind;
    for (const v of voices.filter((x) => x.kind === kind && fits(x))) {
      const detail = kind === 'speaker' ? [v.language, v.gender].filter(Boolean).join(', ')
        : kind === 'openai' ? (v.speaker ? `→ ${v.speaker}` : '')
          : v.models.length ? (MODES[v.mode] || v.mode || '') : `no ${v.model_size} Base model served`;
      const option = new Option(detail ? `${v.name} — ${detail}` : v.name, v.id);
      option.title = v.description || '';
      option.dataset.kind = kind;
      group.append(option);
    }
    return group;
  }).filter((g) => g.children.length);
  if (!built.length) {
    const none = new Option('No voices yet: create one under “New voice”', '');
    none.disabled = true;
    built.push(none);
  }
  select.replaceChildren(...built);
  const options = [...select.options].filter((o) => !o.disabled);
  if (options.some((o) => o.value === previous)) select.value = previous;
  else if (options.length) select.value = options[0].value;
  voiceChanged(preferred !== null || select.value !== before);
}

/** After the voice or the model changed: the note, the delete button, languages, instructions. */
function voiceChanged(newVoice = true) {
  const voice = selectedVoice();
  if (voice) store.set('voice', voice.id);
  const card = cards.get(effectiveModel()) || {};
  const profile = voice && voice.kind === 'profile';
  $('voice-delete').hidden = !profile;
  let note = '';
  if (profile) {
    note = voice.models.length
      ? `Cloned voice (${MODES[voice.mode] || voice.mode}${voice.language ? `, ${voice.language}` : ''}) · speaks with ${voice.models[0]}`
      : `Cloned with a ${voice.model_size} Base model, and none is served: it cannot speak here.`;
  } else if (voice && card.model_type === 'voice_design') {
    note = `Stands in when the voice description is empty: “${voice.description || voice.name}”`;
  } else if (voice) {
    note = voice.description || '';
  }
  $('voice-note').textContent = note;
  updateLanguages(voice, card, newVoice);
  updateInstructions(card);
}

function updateLanguages(voice, card, newVoice) {
  const profile = voice && voice.kind === 'profile';
  const options = [];
  // a profile speaks in the language it was made with unless the request names another
  if (profile) options.push(['', `As recorded (${voice.language || 'auto'})`]);
  options.push(['auto', 'Auto']);
  for (const l of card.languages || LANGUAGES.slice(1)) {
    options.push([l, l[0].toUpperCase() + l.slice(1).replace(/_/g, ' ')]);
  }
  const language = $('language');
  const stored = store.get('language') || 'auto';
  const current = language.options.length ? language.value : stored;
  language.replaceChildren(...options.map(([value, label]) => new Option(label, value)));
  const values = options.map(([value]) => value);
  language.value = profile && newVoice ? '' : values.includes(current) ? current
    : values.includes(stored) ? stored : 'auto';
}

function updateInstructions(card = cards.get(effectiveModel()) || {}) {
  const type = card.model_type;
  const takes = card.instruct_supported !== false; // unknown (no card): leave the field open
  const field = $('instructions');
  $('instructions-field').hidden = !takes && type === 'base'; // a cloned voice speaks as recorded
  field.disabled = !takes;
  $('instructions-label').textContent = type === 'voice_design' ? 'Voice description' : 'Instructions';
  field.placeholder = type === 'voice_design' ? 'e.g. A calm, deep male voice with a slight rasp.'
    : 'e.g. Speak slowly and warmly.';
  $('instructions-note').textContent = type === 'voice_design'
    ? 'VoiceDesign model: the description is the voice (an OpenAI voice name stands in when empty).'
    : takes ? '' : 'This model cannot take instructions.';
}

$('model').addEventListener('change', () => renderVoices());
$('voice').addEventListener('change', () => voiceChanged());
$('language').addEventListener('change', () => store.set('language', $('language').value));
$('api-key').value = store.get('apiKey') || '';
$('api-key').addEventListener('change', () => { store.set('apiKey', apiKey()); closeSocket(); loadModels(); });

$('voice-delete').addEventListener('click', async () => {
  const voice = selectedVoice();
  if (!voice || voice.kind !== 'profile') return;
  if (!window.confirm(`Delete the voice “${voice.name}”? Its profile is removed from the server.`)) return;
  const button = $('voice-delete');
  button.disabled = true;
  try {
    const response = await fetch(`/v1/audio/voices/${encodeURIComponent(voice.id)}`,
      { method: 'DELETE', headers: authHeaders() });
    if (!response.ok) throw await apiError(response);
    await loadVoices().catch((e) => showError(e, 'Could not load the voices'));
    stats.voices.deleted.push(voice.id); // after the picker shows it (the tests wait for this)
  } catch (e) {
    showError(e, 'Could not delete the voice');
  } finally {
    button.disabled = false;
  }
});

/** The request fields the pickers and sampling controls say (shared by HTTP and WebSocket). */
function speechFields() {
  const fields = { model: effectiveModel(), voice: $('voice').value };
  if ($('language').value) fields.language = $('language').value;
  const instructions = $('instructions').value.trim();
  if (instructions && !$('instructions').disabled && !$('instructions-field').hidden) fields.instructions = instructions;
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

// -- "New voice": record or upload a clip (or describe a voice), POST /v1/audio/voices ------------

const nv = { clip: null, previewUrl: null, busy: false, recorder: null };

function renderNewVoice() {
  const all = [...cards.values()];
  const bases = all.filter((c) => c.model_type === 'base');
  const designer = all.find((c) => c.model_type === 'voice_design');
  const select = $('nv-model');
  const previous = select.value;
  select.replaceChildren(...bases.map((c) => new Option(`${c.id} (${c.model_size})`, c.id)));
  if (bases.some((c) => c.id === previous)) select.value = previous;
  $('nv-model-field').hidden = bases.length < 2;
  $('nv-unavailable').hidden = bases.length > 0;
  $('nv-unavailable').textContent = bases.length ? ''
    : 'Cloning needs a Base model, and this server serves none (start it with --model <a Base model folder>).';
  $('nv-create').disabled = !bases.length || nv.busy;
  const design = $('nv-source-design');
  design.disabled = !designer;
  design.closest('label').title = designer ? `Designed by ${designer.id}, then cloned`
    : 'Needs a VoiceDesign model on the server';
  if (!designer && design.checked) $('nv-source-clip').checked = true;
  renderNewVoiceLanguages();
  renderNewVoiceSource();
}

function renderNewVoiceLanguages() {
  const card = cards.get($('nv-model').value) || {};
  const language = $('nv-language');
  const previous = language.value || 'auto';
  const values = ['auto', ...(card.languages || LANGUAGES.slice(1))];
  language.replaceChildren(...values.map((l) => new Option(l[0].toUpperCase() + l.slice(1).replace(/_/g, ' '), l)));
  language.value = values.includes(previous) ? previous : 'auto';
}

const designing = () => $('nv-source-design').checked;

function renderNewVoiceSource() {
  const design = designing();
  $('nv-clip-box').hidden = design;
  $('nv-instructions-field').hidden = !design;
  $('nv-text-label').textContent = design ? 'Sample sentence (optional)' : 'Transcript (optional)';
  $('nv-text').placeholder = design ? 'What the designed voice says for its reference clip'
    : 'What the clip says, word for word';
  $('nv-text-note').textContent = design
    ? 'The designed voice speaks this (or a stock sentence) once; that clip becomes the profile.'
    : 'With a transcript the clone is closest (in-context); without one only the timbre is kept (x-vector).';
}

function setClip(clip) {
  nv.clip = clip;
  if (nv.previewUrl) URL.revokeObjectURL(nv.previewUrl);
  nv.previewUrl = clip ? URL.createObjectURL(clip.blob) : null;
  const preview = $('nv-preview');
  if (clip) preview.src = nv.previewUrl; else preview.removeAttribute('src');
  $('nv-clip').hidden = !clip;
  $('nv-clip-label').textContent = clip ? clipLabel(clip) : '';
  if (!clip) $('nv-file').value = '';
}

function clipLabel(clip) {
  const size = clip.blob.size < 1024 * 1024 ? `${Math.max(1, Math.round(clip.blob.size / 1024))} KB`
    : `${(clip.blob.size / 1024 / 1024).toFixed(1)} MB`;
  return [clip.label, clip.seconds != null ? `${clip.seconds.toFixed(1)} s` : null, size].filter(Boolean).join(' · ');
}

$('nv-preview').addEventListener('loadedmetadata', () => { // a chosen file's length, once the browser knows it
  const d = $('nv-preview').duration;
  if (nv.clip && nv.clip.seconds == null && Number.isFinite(d)) {
    nv.clip.seconds = d;
    $('nv-clip-label').textContent = clipLabel(nv.clip);
  }
});

function nvError(error) {
  const code = [error.status, error.code, error.param && `param: ${error.param}`].filter(Boolean).join(' · ');
  $('nv-error-message').textContent = error.message || String(error);
  $('nv-error-code').textContent = code;
  $('nv-error').hidden = false;
  stats.errors.push({ title: 'Could not create the voice', message: error.message || String(error),
    code: error.code || null, status: error.status || null, where: 'new-voice' });
}

function nvStatus(text, tone = '') {
  $('nv-status').textContent = text;
  $('nv-status').dataset.tone = tone;
}

async function toggleRecording() {
  $('nv-error').hidden = true;
  const button = $('nv-record');
  if (!nv.recorder) {
    nv.recorder = new Recorder({
      onLevel: (peak, seconds) => {
        $('nv-meter-bar').style.width = `${Math.min(100, Math.round(Math.sqrt(peak) * 100))}%`;
        $('nv-record-label').textContent = `Stop · ${seconds.toFixed(1)} s`;
        stats.recording.seconds = seconds;
      },
      onLimit: () => { if (nv.recorder.recording) toggleRecording(); },
    });
  }
  const recorder = nv.recorder;
  if (recorder.recording) {
    if (recorder.stopping) return;
    button.disabled = true;
    try {
      const take = await recorder.stop();
      if (!take) return;
      stats.recording = { state: 'done', seconds: take.seconds, rate: take.rate, peak: take.peak };
      setClip({ blob: take.blob, name: 'recording.wav', label: 'Recording', seconds: take.seconds });
      if (take.peak < 0.001) nvStatus('The recording is silent: is the microphone muted?', 'bad');
      else nvStatus('');
    } catch (e) {
      stats.recording = { state: 'error', seconds: 0 };
      nvError({ message: `The recording failed (${e.message}).` });
    } finally {
      button.disabled = false;
      button.classList.remove('recording');
      $('nv-record-label').textContent = 'Record';
      $('nv-meter').hidden = true;
    }
    return;
  }
  button.disabled = true;
  try {
    stats.recording = { state: 'starting', seconds: 0 };
    await recorder.start();
    stats.recording.state = 'recording';
    setClip(null);
    button.classList.add('recording');
    $('nv-record-label').textContent = 'Stop · 0.0 s';
    $('nv-meter').hidden = false;
    $('nv-meter-bar').style.width = '0%';
  } catch (e) {
    stats.recording = { state: 'error', seconds: 0 };
    nvError({ message: e.message });
  } finally {
    button.disabled = false;
  }
}

async function createVoice(event) {
  event.preventDefault();
  if (nv.busy) return;
  $('nv-error').hidden = true;
  const name = $('nv-name').value.trim();
  const text = $('nv-text').value.trim();
  const instructions = $('nv-instructions').value.trim();
  if (!name) { nvError({ message: 'Give the voice a name.', param: 'name' }); $('nv-name').focus(); return; }
  if (nv.recorder && nv.recorder.recording) await toggleRecording();
  const form = new FormData();
  form.append('name', name);
  if (designing()) {
    if (!instructions) { nvError({ message: 'Describe the voice to design.', param: 'instructions' }); return; }
    form.append('instructions', instructions);
  } else {
    if (!nv.clip) { nvError({ message: 'Record a clip or choose an audio file first.', param: 'audio_sample' }); return; }
    form.append('audio_sample', nv.clip.blob, nv.clip.name);
  }
  if (text) form.append('text', text);
  form.append('language', $('nv-language').value);
  if ($('nv-model').value) form.append('model', $('nv-model').value);
  if ($('nv-overwrite').checked) form.append('overwrite', 'true');
  nv.busy = true;
  $('nv-create').disabled = true;
  nvStatus(designing() ? 'Designing the voice, then cloning it…' : 'Cloning…', 'busy');
  try {
    let response;
    try {
      response = await fetch('/v1/audio/voices', { method: 'POST', headers: authHeaders(), body: form });
    } catch (e) {
      throw new ApiError(`The server could not be reached (${e.message}).`);
    }
    if (!response.ok) throw await apiError(response);
    const created = await response.json();
    nvStatus(`Created “${created.id}” (${MODES[created.mode] || created.mode}, ${created.model}).`, 'ok');
    $('nv-name').value = '';
    $('nv-text').value = '';
    $('nv-instructions').value = '';
    $('nv-overwrite').checked = false;
    setClip(null);
    await loadVoices(created.id).catch((e) => showError(e, 'Could not load the voices'));
    stats.voices.created.push(created); // after the picker shows it (the tests wait for this)
  } catch (e) {
    nvStatus('');
    nvError(e);
  } finally {
    nv.busy = false;
    $('nv-create').disabled = ![...cards.values()].some((c) => c.model_type === 'base');
  }
}

$('nv-record').addEventListener('click', toggleRecording);
$('nv-file').addEventListener('change', () => {
  const file = $('nv-file').files[0];
  $('nv-error').hidden = true;
  if (file) setClip({ blob: file, name: file.name, label: file.name, seconds: null });
});
$('nv-clip-clear').addEventListener('click', () => setClip(null));
$('nv-model').addEventListener('change', renderNewVoiceLanguages);
for (const radio of document.querySelectorAll('input[name="nv-source"]')) radio.addEventListener('change', renderNewVoiceSource);
$('nv-form').addEventListener('submit', createVoice);
$('nv-error-close').addEventListener('click', () => { $('nv-error').hidden = true; });

// -- requests: history and figures ---------------------------------------------------------------

function newRequest(mode, text) {
  const req = { n: stats.requests.length + 1, mode, model: effectiveModel(), voice: $('voice').value,
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
  } else if (event.type === 'progress') {
    if (req && live.state !== 'cancelling') spoken.add(event);
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
  spoken.reset();
  live.req = newRequest('live', '');
  live.stopAfterStart = false;
  setLiveState('starting');
  try {
    const ws = await connect();
    ws.send(JSON.stringify({ type: 'start', format: 'pcm', progress: true, ...speechFields() }));
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
  spoken.setText(req.text);
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
