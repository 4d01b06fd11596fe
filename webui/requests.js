// The request history and the figures above it: one row per request, time to first audio, RTF.

import { SAMPLE_RATE } from './player.js';
import { $, player, stats } from './page.js';
import { effectiveModel, refreshStatus } from './voices.js';

const MODE_NAMES = { speak: 'speak', live: 'typing', dialogue: 'dialogue' };

/** A new request in the history (`mode`: 'speak' over HTTP, 'live' over the WebSocket, 'dialogue'); its model
 * and voice are the pickers' unless given. */
export function newRequest(mode, text, { model = effectiveModel(), voice = $('voice').value } = {}) {
  const req = { n: stats.requests.length + 1, mode, model, voice,
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

export function renderRequest(req) {
  const row = $(`req-${req.n}`);
  const cells = [req.n, MODE_NAMES[req.mode], req.voice,
    req.text.length > 48 ? `${req.text.slice(0, 47)}…` : req.text, ms(req.ttfaMs), secs(req.samples),
    req.rtf == null ? '—' : req.rtf.toFixed(2), req.finish];
  row.replaceChildren(...cells.map((c) => { const td = document.createElement('td'); td.textContent = c; return td; }));
  row.lastChild.dataset.finish = req.finish;
  row.children[3].title = req.text;
  $('ttfa').textContent = ms(req.ttfaMs);
  $('rtf').textContent = req.rtf == null ? '—' : `${req.rtf.toFixed(2)}×`;
  $('audio-len').textContent = secs(req.samples);
  $('chunks').textContent = String(req.chunks);
  renderDownload();
}

/** The download button: enabled while the current take has audio. */
export function renderDownload() { $('download').disabled = player.takeSamples === 0; }

/** A chunk of a request's audio arrived: play it; the first one sets the time to first audio (from `since`). */
export function gotAudio(req, pcm, since) {
  if (req.ttfaMs == null) {
    req.ttfaMs = performance.now() - since;
    stats.ttfaMs = req.ttfaMs;
  }
  player.enqueue(pcm);
  req.samples += pcm.length;
  req.chunks++;
  renderRequest(req);
}

export function finishRequest(req, finish, rtf = null) {
  if (req.finish !== 'running') return;
  req.finish = finish;
  req.rtf = rtf;
  if (rtf != null) stats.rtf = rtf;
  renderRequest(req);
  refreshStatus();
}
