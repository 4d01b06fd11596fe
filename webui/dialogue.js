// The dialogue panel: a script of `voice: text` lines (voices from GET /v1/audio/voices) played through
// POST /v1/text-to-dialogue/stream as raw pcm (s16le, mono, 24 kHz), heard as it streams in through the
// console's player and listed in the request history. A bad line is named in the panel, nothing is sent.

import { apiError, authHeaders, getJSON, httpUrl } from './api.js';
import { $, errorCode, player, recordError, stats } from './page.js';
import { readPcmBody } from './pcm-body.js';
import { SAMPLE_RATE } from './player.js';
import { finishRequest, gotAudio, newRequest } from './requests.js';
import { cards } from './voices.js';

export const DIALOGUE_ROUTE = '/v1/text-to-dialogue/stream?output_format=pcm_24000';
const QUOTE_CHARS = 40; // of a bad line quoted in its message

let voices = [];        // GET /v1/audio/voices
let dialogueAbort = null;
stats.dialogue = { state: 'idle', turns: 0, samples: 0, ttfaMs: null, problems: [] };

const quote = (s) => `“${s.length > QUOTE_CHARS ? `${s.slice(0, QUOTE_CHARS - 1)}…` : s}”`;

/** The script's turns (`{text, voice_id}`), and a message for each bad line (numbered from 1). `known`: voice
 * ids and names, lower-cased, to the voice's id. */
export function parseScript(script, known) {
  const turns = [];
  const problems = [];
  script.split('\n').forEach((raw, i) => {
    const line = raw.trim();
    if (!line) return;
    const at = `Line ${i + 1}`;
    const colon = line.indexOf(':');
    if (colon < 0) {
      problems.push(`${at}: write it as “voice: text” (${quote(line)} has no colon).`);
      return;
    }
    const name = line.slice(0, colon).trim();
    const text = line.slice(colon + 1).trim();
    const voice = known.get(name.toLowerCase());
    if (!name) problems.push(`${at}: no voice before the colon.`);
    else if (!voice) problems.push(`${at}: no voice ${quote(name)} here (the voices are listed under the script).`);
    if (!text) problems.push(`${at}: nothing to say after “${name}:”.`);
    if (voice && text) turns.push({ text, voice_id: voice });
  });
  if (!turns.length && !problems.length) problems.push('Write at least one line: “voice: text”.');
  return { turns, problems };
}

function knownVoices() {
  const known = new Map();
  for (const v of voices) {
    known.set(v.name.toLowerCase(), v.id);
    known.set(v.id.toLowerCase(), v.id); // an id wins over another voice's name
  }
  return known;
}

// -- the panel ------------------------------------------------------------------------------------

function showProblem(error, title, lines = []) {
  $('dlg-error-title').textContent = title;
  $('dlg-error-message').textContent = lines.length ? '' : error.message || String(error);
  $('dlg-error-lines').replaceChildren(...lines.map((l) => { const li = document.createElement('li'); li.textContent = l; return li; }));
  const code = errorCode(error);
  $('dlg-error-code').textContent = code;
  $('dlg-error-code').hidden = !code;
  $('dlg-error').hidden = false;
  recordError(error, title, 'dialogue');
}

const clearProblem = () => { $('dlg-error').hidden = true; };

/** After the model cards load: the model picker, the voices, an example script if there is none. */
export async function renderDialogue() {
  const select = $('dlg-model');
  const previous = select.value;
  select.replaceChildren(new Option('Server default', ''), ...[...cards.keys()].map((id) => new Option(id, id)));
  if (cards.has(previous)) select.value = previous;
  try {
    ({ voices } = await getJSON('/v1/audio/voices'));
  } catch (e) {
    showProblem(e, 'Could not load the voices');
    return;
  }
  $('dlg-voices').textContent = voices.length ? `Voices: ${voices.map((v) => v.id).join(', ')}` : 'No voices served.';
  const speakers = voices.filter((v) => v.kind === 'speaker').map((v) => v.id);
  if (!$('dlg-script').value.trim() && speakers.length) {
    const [a, b = speakers[0]] = speakers;
    $('dlg-script').value = `${a}: Did you hear? The server speaks whole dialogues now.\n`
      + `${b}: One voice per line, streamed as it is made.\n${a}: Then let us try it.`;
  }
}

async function playDialogue() {
  clearProblem();
  try {
    ({ voices } = await getJSON('/v1/audio/voices')); // a voice made a moment ago counts
  } catch (e) {
    showProblem(e, 'Could not load the voices');
    return;
  }
  const script = $('dlg-script').value;
  const { turns, problems } = parseScript(script, knownVoices());
  stats.dialogue = { state: 'idle', turns: turns.length, samples: 0, ttfaMs: null, problems };
  if (problems.length) {
    showProblem({ message: problems.join('\n') }, `The script has ${problems.length} bad line${problems.length > 1 ? 's' : ''}`,
      problems);
    return;
  }
  const body = { inputs: turns };
  if ($('dlg-model').value) body.model_id = $('dlg-model').value;
  const seed = $('dlg-seed').value.trim();
  if (seed !== '') body.seed = Number(seed); // its domain is the server's to check (the error is shown here)
  stopDialogue();
  player.ensure();
  player.newTake();
  const req = newRequest('dialogue', script.trim().replace(/\s*\n\s*/g, ' / '),
    { model: body.model_id || 'default', voice: [...new Set(turns.map((t) => t.voice_id))].join(', ') });
  const abort = (dialogueAbort = new AbortController());
  stats.dialogue.state = 'playing';
  $('dlg-status').textContent = `${turns.length} turn${turns.length > 1 ? 's' : ''}: playing…`;
  try {
    const response = await fetch(httpUrl(DIALOGUE_ROUTE), { method: 'POST', signal: abort.signal,
      headers: { 'Content-Type': 'application/json', ...authHeaders() }, body: JSON.stringify(body) });
    if (!response.ok) throw await apiError(response);
    await readPcmBody(response, (samples) => {
      gotAudio(req, samples, req.t0);
      Object.assign(stats.dialogue, { samples: req.samples, ttfaMs: req.ttfaMs });
    });
    const audioS = req.samples / SAMPLE_RATE;
    finishRequest(req, 'complete', audioS ? (performance.now() - req.t0) / 1000 / audioS : null);
    stats.dialogue.state = 'complete';
    $('dlg-status').textContent = `${audioS.toFixed(2)} s of audio, first after ${Math.round(req.ttfaMs ?? 0)} ms`;
  } catch (e) {
    const cancelled = abort.signal.aborted;
    finishRequest(req, cancelled ? 'cancelled' : 'error');
    stats.dialogue.state = cancelled ? 'cancelled' : 'error';
    $('dlg-status').textContent = cancelled ? 'stopped' : '';
    if (!cancelled) showProblem(e, e.status ? 'The server refused the dialogue' : 'The dialogue broke off');
  } finally {
    if (dialogueAbort === abort) dialogueAbort = null;
  }
}

/** Abort the dialogue being fetched, if any (its history row finishes as cancelled). */
export function stopDialogue() {
  if (dialogueAbort) dialogueAbort.abort();
}

$('dlg-play').addEventListener('click', playDialogue);
$('dlg-stop').addEventListener('click', () => { stopDialogue(); player.stop(); });
$('dlg-error-close').addEventListener('click', clearProblem);
