// The Lab's concurrency run: N speech streams at once from this browser (POST /v1/audio/speech, raw pcm,
// read as fast as they come, not played), each one's first audio and real-time factor (wall time over
// audio time), and the server's /metrics scraped before, during (the gauges' peaks) and after.

import { ApiError, authHeaders, httpUrl } from '../api.js';
import { SAMPLE_RATE } from '../player.js';
import { GAUGES, figures } from './metrics.js';
import { streamSpeech } from './speech-http.js';

// A browser opens at most 6 HTTP/1.1 connections to one host: 5 streams, and one left for the /metrics scrapes
// (a 7th request would wait in the browser, not in the server).
export const MAX_STREAMS = 5;
const SCRAPE_MS = 250;
const SETTLE_TRIES = 20; // scrapes, 100 ms apart, for the server to count the streams that just ended

const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

/** GET /metrics, traced; the figures the Lab shows (metrics.js). */
export async function scrapeMetrics(trace) {
  trace.add('sent', 'http', 'metrics', 'GET /metrics', null);
  const response = await fetch(httpUrl('metrics'), { headers: authHeaders() });
  const text = await response.text();
  trace.add('received', 'http', 'metrics', `${response.status} metrics`, { bytes: text.length });
  if (!response.ok) throw new ApiError(`GET /metrics answered ${response.status}.`, { status: response.status });
  return figures(text);
}

/** Run `n` streams of `text` with the console's `fields`; `onUpdate(run)` as figures change. Returns the run:
 * `{n, streams: [{n, state, firstAudioMs, audioS, wallS, rtf, chunks, error}], metrics: {before, peak, after}}`. */
export async function runConcurrency({ n, text, fields, trace, signal, onUpdate }) {
  const run = { n, streams: [], metrics: { before: null, peak: {}, after: null } };
  const before = await scrapeMetrics(trace);
  run.metrics.before = before;
  for (const [name] of GAUGES) run.metrics.peak[name] = before[name];
  run.streams = Array.from({ length: n }, (_, i) => ({ n: i + 1, state: 'running', firstAudioMs: null, audioS: 0,
    wallS: null, rtf: null, chunks: 0, error: null }));
  onUpdate(run);
  let running = true;
  const polling = (async () => {
    while (running) {
      await sleep(SCRAPE_MS);
      if (!running) break;
      const now = await scrapeMetrics(trace).catch(() => null);
      for (const [name] of GAUGES) {
        if (now && now[name] !== null) run.metrics.peak[name] = Math.max(run.metrics.peak[name] ?? 0, now[name]);
      }
      onUpdate(run);
    }
  })();
  await Promise.all(run.streams.map((stream) => oneStream(stream, { text, fields, trace, signal,
    update: () => onUpdate(run) })));
  running = false;
  await polling;
  // the server counts a stream as its response ends, which can be just after the browser read the last byte
  const served = run.streams.filter((s) => s.state === 'complete').length;
  let after = await scrapeMetrics(trace);
  for (let i = 0; i < SETTLE_TRIES && after.qtts_speech_streams_total - before.qtts_speech_streams_total < served;
    i++) {
    await sleep(100);
    after = await scrapeMetrics(trace);
  }
  run.metrics.after = after;
  onUpdate(run);
  return run;
}

async function oneStream(stream, { text, fields, trace, signal, update }) {
  const t0 = performance.now();
  try {
    await streamSpeech({ fields, input: text, trace, lane: `stream ${stream.n}`, signal, onAudio: (samples, at) => {
      if (stream.firstAudioMs === null) stream.firstAudioMs = at - t0;
      stream.audioS += samples.length / SAMPLE_RATE;
      stream.chunks++;
      update();
    } });
    stream.wallS = (performance.now() - t0) / 1000;
    stream.rtf = stream.audioS > 0 ? stream.wallS / stream.audioS : null;
    stream.state = 'complete';
  } catch (e) {
    stream.state = signal.aborted ? 'cancelled' : 'error';
    if (!signal.aborted) stream.error = { message: e.message, status: e.status ?? null, code: e.code ?? null };
  }
  update();
}
