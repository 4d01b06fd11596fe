// "New voice": record or upload a clip (or describe a voice), POST /v1/audio/voices.

import { ApiError, apiError, authHeaders } from './api.js';
import { $, LANGUAGES, errorCode, languageLabel, recordError, showError, stats } from './page.js';
import { Recorder } from './recorder.js';
import { MODES, cards, loadVoices } from './voices.js';

const nv = { clip: null, previewUrl: null, busy: false, recorder: null };

/** The panel as the model cards allow: which Base models clone, whether a VoiceDesign model designs. */
export function renderNewVoice() {
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
  language.replaceChildren(...values.map((l) => new Option(languageLabel(l), l)));
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

function nvError(error) {
  $('nv-error-message').textContent = error.message || String(error);
  $('nv-error-code').textContent = errorCode(error);
  $('nv-error').hidden = false;
  recordError(error, 'Could not create the voice', 'new-voice');
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
      response = await fetch('v1/audio/voices', { method: 'POST', headers: authHeaders(), body: form });
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

$('nv-preview').addEventListener('loadedmetadata', () => { // a chosen file's length, once the browser knows it
  const d = $('nv-preview').duration;
  if (nv.clip && nv.clip.seconds == null && Number.isFinite(d)) {
    nv.clip.seconds = d;
    $('nv-clip-label').textContent = clipLabel(nv.clip);
  }
});
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
