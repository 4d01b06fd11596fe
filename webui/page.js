// What every panel of the console shares: element lookup, the figures tests read (window.__qtts),
// settings kept in localStorage, the error banner, the status pills, and the one player.

import { SpokenText } from './highlight.js';
import { Player, Scope } from './player.js';

export const $ = (id) => document.getElementById(id);

export const stats = {
  ready: false,          // models and voices loaded
  scheduledSamples: 0,   // every sample handed to the AudioContext
  chunks: 0,
  underruns: 0,
  ttfaMs: null,          // of the latest request
  rtf: null,
  requests: [],          // one entry per request (see requests.js, newRequest)
  errors: [],            // every error shown
  events: [],            // WebSocket JSON events, in order
  progress: null,        // the last text-progress event shown (typing mode)
  live: { state: 'off', sentChars: 0, charsAtFirstAudio: null },
  voices: { created: [], deleted: [] }, // POST / DELETE /v1/audio/voices that succeeded
  recording: { state: 'idle', seconds: 0 },
  audioContext: null,
};
window.__qtts = stats;

export const player = new Player(stats);
new Scope($('scope'), player);
export const spoken = new SpokenText($('spoken'), player, stats); // the text as it is spoken

// The official Qwen3-TTS languages; a model card that lists its own (`languages`) wins.
export const LANGUAGES = ['auto', 'english', 'chinese', 'japanese', 'korean', 'german', 'french', 'russian',
  'portuguese', 'spanish', 'italian'];

/** "english" -> "English", "cantonese_hk" -> "Cantonese hk": a language value as a picker shows it. */
export const languageLabel = (l) => l[0].toUpperCase() + l.slice(1).replace(/_/g, ' ');

export const store = {
  get: (k) => { try { return localStorage.getItem(`qtts.${k}`); } catch { return null; } },
  set: (k, v) => { try { localStorage.setItem(`qtts.${k}`, v); } catch { /* private mode */ } },
};

// -- errors: always shown, never swallowed ------------------------------------------------------

/** "401 · invalid_api_key · param: voice": what an error's status, code and param say, in one line. */
export const errorCode = (error) =>
  [error.status, error.code, error.param && `param: ${error.param}`].filter(Boolean).join(' · ');

/** Record an error where the tests read it (`where` names the panel that showed it, if not the banner). */
export function recordError(error, title, where = null) {
  stats.errors.push({ title, message: error.message || String(error), code: error.code || null,
    status: error.status || null, ...(where ? { where } : {}) });
}

export function showError(error, title = 'Server error') {
  const code = errorCode(error);
  $('error-title').textContent = title;
  $('error-message').textContent = error.message || String(error);
  $('error-code').textContent = code;
  $('error-code').hidden = !code;
  $('error').hidden = false;
  recordError(error, title);
  if (error.status === 401) $('api-key').focus();
}

export function clearError() { $('error').hidden = true; }

$('error-close').addEventListener('click', clearError);
window.addEventListener('error', (e) => showError({ message: e.message }, 'Page error'));
window.addEventListener('unhandledrejection', (e) => showError({ message: String(e.reason?.message ?? e.reason) },
  'Page error'));

/** Offer `blob` as a download named `name` (the WAV of what was heard, the Lab's trace). */
export function saveBlob(blob, name) {
  const link = document.createElement('a');
  link.href = URL.createObjectURL(blob);
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

export function setPill(el, text, tone) {
  el.textContent = text;
  el.dataset.tone = tone || '';
}
