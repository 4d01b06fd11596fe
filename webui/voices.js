// The pickers: models, voices, languages, instructions, sampling fields.
// The model cards (/v1/models) say what each model is and can do (model_type, instruct_supported,
// languages, speakers); /v1/audio/voices lists every voice once: speakers and OpenAI names with the
// models that have them, and the saved voice profiles with the Base models they speak with.

import { ApiError, apiError, authHeaders, getJSON } from './api.js';
import { $, LANGUAGES, clearError, languageLabel, setPill, showError, stats, store } from './page.js';

export const cards = new Map();   // served model id -> its /v1/models card
let voices = [];                  // GET /v1/audio/voices

export const TYPE_NAMES = { custom_voice: 'CustomVoice', voice_design: 'VoiceDesign', base: 'Base (cloning)' };
export const MODES = { icl: 'in-context clone', xvector: 'x-vector clone' };

export async function refreshStatus() {
  try {
    const response = await fetch('ready');
    const body = await response.json();
    if (!response.ok) throw new ApiError(body.error?.message || 'not ready');
    const active = body.models.reduce((n, m) => n + m.active, 0);
    const waiting = body.models.reduce((n, m) => n + m.waiting, 0);
    setPill($('server-status'), `ready · ${body.models.length} model${body.models.length > 1 ? 's' : ''} · ${active} active${waiting ? ` · ${waiting} waiting` : ''}`, 'ok');
  } catch (e) {
    setPill($('server-status'), `not ready: ${e.message}`, 'bad');
  }
}

/** Load the model cards and voices; `onCards` runs once the cards are in (other panels render from them). */
export async function loadModels(onCards = () => {}) {
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
    onCards();
    clearError();
    stats.ready = true;
  } catch (e) {
    showError(e, e.status === 401 ? 'API key needed' : 'Could not load the models');
  }
}

/** Fetch the voice list, then show the picker with `select` (a voice id) selected if given. */
export async function loadVoices(select = null) {
  ({ voices } = await getJSON('/v1/audio/voices'));
  renderVoices(select);
}

const selectedVoice = () => voices.find((v) => v.id === $('voice').value) || null;

/** The model a request goes to: the picked one, or the Base model of a picked voice profile. */
export function effectiveModel() {
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
  for (const l of card.languages || LANGUAGES.slice(1)) options.push([l, languageLabel(l)]);
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

$('voice-delete').addEventListener('click', async () => {
  const voice = selectedVoice();
  if (!voice || voice.kind !== 'profile') return;
  if (!window.confirm(`Delete the voice “${voice.name}”? Its profile is removed from the server.`)) return;
  const button = $('voice-delete');
  button.disabled = true;
  try {
    const response = await fetch(`v1/audio/voices/${encodeURIComponent(voice.id)}`,
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
export function speechFields() {
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
