// The Lab's race: one reply, fed as an LLM's tokens at a chosen rate, spoken two ways, one after the other
// (each alone on the server, played as it comes):
// - token-level: one live utterance on /v1/ws, `start` sent before the first token (as docs/protocols.md
//   advises), each token a `text` message as it arrives, `stop` after the last;
// - sentence-level: each sentence, once the feed has completed it, one POST /v1/audio/speech (raw pcm),
//   one request at a time, as a sentence-splitting TTS pipeline does.
// Every time is in ms from the lane's first token.

import { ApiError, openSocket } from '../api.js';
import { player } from '../page.js';
import { SAMPLE_RATE, s16 } from '../player.js';
import { llmTokens, paceTokens, sentenceEnd } from './feed.js';
import { streamSpeech } from './speech-http.js';

const STALL_MS = 10; // a gap in playback longer than this is a stall
export const TOKEN_LANE = 'token-level';
export const SENTENCE_LANE = 'sentence-level';

const newLane = (name) => ({ name, t0: null, tokens: [], chunks: [], requests: [], samples: 0, stalls: 0,
  stallMs: 0, firstAudioMs: null, firstPlayedMs: null, lastAudioMs: null, finish: null, error: null });

const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

/** Run the race: `text` at `rate` tokens/s with the console's speech `fields`; `onUpdate(race)` after each
 * token and chunk. Returns the race: `{rate, tokens, lanes: {token, sentence}}` (a lane's `error` says why
 * it stopped short). */
export async function runRace({ text, rate, fields, trace, signal, onUpdate }) {
  const race = { rate, tokens: llmTokens(text).length, lanes: { token: newLane(TOKEN_LANE),
    sentence: newLane(SENTENCE_LANE) } };
  const run = { race, tokens: llmTokens(text), rate, fields, trace, signal, update: () => onUpdate(race) };
  for (const [lane, speak] of [[race.lanes.token, tokenLane], [race.lanes.sentence, sentenceLane]]) {
    if (signal.aborted) break;
    player.newTake();
    try {
      await speak(run, lane);
    } catch (e) {
      if (!signal.aborted) lane.error = e;
    }
    run.update();
    await sleep(Math.max(0, (player.nextTime - player.ensure().currentTime) * 1000) + 50); // until it has played
  }
  return race;
}

/** A chunk of `lane`'s audio arrived at `at`: play it and note when it arrived and when it plays. */
function heard(run, lane, samples, at) {
  const ctx = player.ensure();
  player.enqueue(samples);
  const startsIn = (player.nextTime - samples.length / SAMPLE_RATE - ctx.currentTime) * 1000;
  const chunk = { at: at - lane.t0, playAt: at - lane.t0 + startsIn, playEnd: 0, samples: samples.length };
  chunk.playEnd = chunk.playAt + (samples.length / SAMPLE_RATE) * 1000;
  const previous = lane.chunks.at(-1);
  if (previous && chunk.playAt - previous.playEnd > STALL_MS) {
    lane.stalls++;
    lane.stallMs += chunk.playAt - previous.playEnd;
  }
  if (!previous) {
    lane.firstAudioMs = chunk.at;
    lane.firstPlayedMs = chunk.playAt;
  }
  lane.lastAudioMs = chunk.at;
  lane.chunks.push(chunk);
  lane.samples += samples.length;
  run.update();
}

/** Token-level: one utterance on /v1/ws, fed token by token. */
async function tokenLane(run, lane) {
  const { trace, signal } = run;
  const ws = openSocket('/v1/ws', 'qtts.v1');
  trace.add('sent', 'ws', lane.name, 'connect', { path: '/v1/ws', subprotocol: 'qtts.v1' });
  const send = (message) => {
    ws.send(JSON.stringify(message));
    trace.add('sent', 'ws', lane.name, message.type, message);
  };
  const settle = {};
  const started = new Promise((resolve, reject) => Object.assign(settle, { started: resolve, refused: reject }));
  const done = new Promise((resolve, reject) => Object.assign(settle, { done: resolve, failed: reject }));
  started.catch(() => {}); // awaited below; a rejection is handled there, not reported as unhandled
  done.catch(() => {});
  ws.onopen = () => {
    trace.add('received', 'ws', lane.name, 'open', { subprotocol: ws.protocol });
    send({ type: 'start', ...run.fields, format: 'pcm' });
  };
  ws.onmessage = (e) => {
    if (typeof e.data !== 'string') {
      heard(run, lane, s16(new Uint8Array(e.data)), trace.add('received', 'ws', lane.name, 'audio',
        { bytes: e.data.byteLength }));
      return;
    }
    const event = JSON.parse(e.data);
    trace.add('received', 'ws', lane.name, event.type, event);
    if (event.type === 'started') settle.started();
    else if (event.type === 'done') settle.done(event);
    else if (event.type === 'error') {
      const error = new ApiError(event.error.message, event.error);
      settle.refused(error); // a refused start; after `started`, `done` follows with finish_reason "error"
      lane.error = lane.error || error;
    }
  };
  ws.onclose = (e) => {
    trace.add('received', 'ws', lane.name, 'close', { code: e.code, reason: e.reason });
    const error = new Error(`The socket closed (code ${e.code}${e.reason ? `: ${e.reason}` : ''}).`);
    settle.refused(error);
    settle.failed(error);
  };
  const cancel = () => { if (ws.readyState === WebSocket.OPEN) send({ type: 'cancel' }); ws.close(1000); };
  signal.addEventListener('abort', cancel);
  try {
    await started;
    lane.t0 = performance.now();
    await paceTokens(run.tokens, run.rate, (token, i, at) => {
      lane.tokens.push({ at: at - lane.t0, text: token });
      send({ type: 'text', text: token });
      run.update();
    }, signal);
    if (signal.aborted) return;
    send({ type: 'stop' });
    lane.finish = (await done).finish_reason;
  } finally {
    signal.removeEventListener('abort', cancel);
    if (ws.readyState <= WebSocket.OPEN) ws.close(1000);
  }
}

/** Sentence-level: each sentence, once complete, one speech request, one after another. */
async function sentenceLane(run, lane) {
  lane.t0 = performance.now();
  let text = '';
  let cut = 0; // where the sentence being written starts
  let chain = Promise.resolve(); // the requests, in order (each one catches its own failure)
  const queue = (sentence, readyAt) => {
    const request = { n: lane.requests.length + 1, text: sentence, readyAt: readyAt - lane.t0, sentAt: null,
      firstAudioAt: null, endAt: null };
    lane.requests.push(request);
    chain = chain.then(() => speakSentence(run, lane, request));
  };
  await paceTokens(run.tokens, run.rate, (token, i, at) => {
    lane.tokens.push({ at: at - lane.t0, text: token });
    text += token;
    for (let end = sentenceEnd(text, cut); end >= 0; end = sentenceEnd(text, cut)) {
      const sentence = text.slice(cut, end).trim();
      cut = end;
      if (sentence) queue(sentence, at);
    }
    run.update();
  }, run.signal);
  const rest = text.slice(cut).trim(); // the feed has ended: its last words are a sentence
  if (rest && !run.signal.aborted) queue(rest, performance.now());
  await chain;
  lane.finish = lane.error ? 'error' : run.signal.aborted ? 'cancelled' : 'complete';
}

async function speakSentence(run, lane, request) {
  if (lane.error || run.signal.aborted) return;
  request.sentAt = performance.now() - lane.t0;
  run.update();
  try {
    await streamSpeech({ fields: run.fields, input: request.text, trace: run.trace, lane: `sentence ${request.n}`,
      signal: run.signal, onAudio: (samples, at) => {
        if (request.firstAudioAt === null) request.firstAudioAt = at - lane.t0;
        heard(run, lane, samples, at);
      } });
    request.endAt = performance.now() - lane.t0;
  } catch (e) {
    if (!run.signal.aborted) lane.error = e;
  }
  run.update();
}
