// The Lab panel, live against this server: the race (race.js, drawn by timeline.js), the concurrency run
// (concurrency.js, metrics.js) and the event trace of the last run (trace.js). One run at a time; each uses
// the console's voice, model and sampling fields. Tests read window.__qtts.lab.

import { $, player, recordError, showError, stats } from '../page.js';
import { SAMPLE_RATE } from '../player.js';
import { renderDownload } from '../requests.js';
import { speechFields } from '../voices.js';
import { COUNTERS, GAUGES, HISTOGRAMS, meanBetween } from './metrics.js';
import { MAX_STREAMS, runConcurrency } from './concurrency.js';
import { runRace } from './race.js';
import { drawRace } from './timeline.js';
import { Trace } from './trace.js';

const MAX_RATE = 200; // tokens/s: faster than any LLM a person reads along with

const trace = new Trace($('lab-trace'), $('lab-trace-note'));
stats.lab = { state: 'idle', race: null, concurrency: null, trace: trace.events };
let abort = null;

const ms = (v) => (v === null || v === undefined ? '—' : `${Math.round(v)} ms`);
const fixed = (v, digits) => (v === null || v === undefined ? '—' : v.toFixed(digits));

function cells(row, values) {
  row.replaceChildren(...values.map((v) => { const td = document.createElement('td'); td.textContent = v; return td; }));
  return row;
}

/** A number input's value, checked against its domain; null (and the error shown) when it is outside. */
function bounded(id, label, low, high) {
  const value = Number($(id).value);
  if (Number.isInteger(value) && value >= low && value <= high) return value;
  showError({ message: `${label} must be a whole number from ${low} to ${high}.` }, 'Lab');
  return null;
}

function replyText() {
  const text = $('lab-text').value;
  if (text.trim()) return text;
  showError({ message: 'Write the reply the Lab speaks first.' }, 'Lab');
  return null;
}

/** Run `body(signal)` as the Lab's one run named `name`, with its own trace; the buttons follow. */
async function labRun(name, body) {
  if (abort) return;
  abort = new AbortController();
  player.ensure(); // in the click: a browser lets a page start audio only from a user's gesture
  trace.begin(name);
  stats.lab.trace = trace.events;
  $('lab-trace-copied').textContent = '';
  stats.lab.state = name;
  for (const id of ['lab-race-run', 'lab-conc-run']) $(id).disabled = true;
  $('lab-stop').disabled = false;
  $('lab-status').textContent = `${name}: running…`;
  try {
    await body(abort.signal);
    $('lab-status').textContent = `${name}: ${abort.signal.aborted ? 'stopped' : 'done'}`;
  } catch (e) {
    $('lab-status').textContent = `${name}: failed`;
    showError(e, `Lab: ${name}`);
  } finally {
    abort = null;
    stats.lab.state = 'idle';
    for (const id of ['lab-race-run', 'lab-conc-run']) $(id).disabled = false;
    $('lab-stop').disabled = true;
  }
}

// -- the race --------------------------------------------------------------------------------------

let drawPending = false;
function renderRace() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => { drawPending = false; showRace(); });
}

function showRace() {
  const race = stats.lab.race;
  drawRace($('lab-timeline'), race);
  if (!race) return;
  const body = $('lab-race-figures').tBodies[0];
  body.replaceChildren(...Object.values(race.lanes).map((lane) => {
    const requests = lane.name === 'token-level' ? '1 socket' : `${lane.requests.length} requests`;
    const row = cells(document.createElement('tr'), [lane.name, ms(lane.firstAudioMs), ms(lane.firstPlayedMs),
      ms(lane.lastAudioMs), `${(lane.samples / SAMPLE_RATE).toFixed(2)} s`,
      lane.stalls ? `${lane.stalls} · ${Math.round(lane.stallMs)} ms` : '0', requests,
      lane.error ? `error: ${lane.error.message}` : lane.finish ?? 'running']);
    row.dataset.lane = lane.name;
    return row;
  }));
}

$('lab-race-run').addEventListener('click', () => {
  const rate = bounded('lab-rate', 'Tokens per second', 1, MAX_RATE);
  const text = replyText();
  if (rate === null || text === null) return;
  labRun('race', async (signal) => {
    stats.lab.race = null;
    const race = await runRace({ text, rate, fields: speechFields(), trace, signal, onUpdate: (r) => {
      stats.lab.race = r;
      renderRace();
    } });
    stats.lab.race = race;
    showRace();
    renderDownload(); // the console's "Download WAV": the take of the last lane, as heard
    for (const lane of Object.values(race.lanes)) {
      if (lane.error) showError(lane.error, `Lab race: ${lane.name}`);
    }
  });
});

// -- concurrency ----------------------------------------------------------------------------------

function showConcurrency(run) {
  stats.lab.concurrency = run;
  $('lab-streams').tBodies[0].replaceChildren(...run.streams.map((s) => {
    const row = cells(document.createElement('tr'), [s.n, ms(s.firstAudioMs), `${s.audioS.toFixed(2)} s`,
      s.wallS === null ? '—' : `${s.wallS.toFixed(2)} s`, fixed(s.rtf, 2), s.chunks,
      s.error ? `${[s.error.status, s.error.code].filter(Boolean).join(' ')}: ${s.error.message}` : s.state]);
    row.lastChild.dataset.finish = s.error ? 'error' : s.state;
    return row;
  }));
  const { before, peak, after } = run.metrics;
  const value = (figures, name, digits = 0) => (figures && figures[name] !== null ? fixed(figures[name], digits) : '—');
  const rows = [
    ...GAUGES.map(([name, label]) => [label, name, value(before, name), value(peak, name), value(after, name), '']),
    ...COUNTERS.map(([name, label, digits]) => [label, name, value(before, name, digits), '',
      value(after, name, digits), after ? `+${fixed(after[name] - before[name], digits)}` : '']),
    ...HISTOGRAMS.map(([name, label, scale]) => [label, name, '', '', '',
      after ? fixed(meanBetween(before, after, name, scale), scale === 1 ? 2 : 0) : '']),
  ];
  $('lab-metrics').tBodies[0].replaceChildren(...rows.map((r) => {
    const row = cells(document.createElement('tr'), [r[0], ...r.slice(2)]);
    row.dataset.series = r[1];
    row.firstChild.title = r[1];
    return row;
  }));
}

$('lab-n').max = String(MAX_STREAMS);
$('lab-conc-run').addEventListener('click', () => {
  const n = bounded('lab-n', 'Streams', 1, MAX_STREAMS);
  const text = replyText();
  if (n === null || text === null) return;
  labRun('concurrency', async (signal) => {
    const run = await runConcurrency({ n, text, fields: speechFields(), trace, signal, onUpdate: showConcurrency });
    for (const s of run.streams) if (s.error) recordError(s.error, `Lab stream ${s.n}`, 'lab');
  });
});

// -- stop, trace, drawing -------------------------------------------------------------------------

$('lab-stop').addEventListener('click', () => {
  if (abort) abort.abort();
  player.stop();
});
$('lab-trace-download').addEventListener('click', () => trace.download());
$('lab-trace-copy').addEventListener('click', async () => {
  $('lab-trace-copied').textContent = (await trace.copy()) ? 'copied' : 'could not copy: use Download';
});
$('lab').addEventListener('toggle', () => showRace());
window.addEventListener('resize', () => { if ($('lab').open) showRace(); });
