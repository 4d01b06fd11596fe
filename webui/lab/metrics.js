// The server's /metrics (Prometheus text exposition) read by the Lab: the few series that say how busy the
// server is and what its streams achieved (api/README.md lists them; api/ops/metrics.py writes them).

const LINE = /^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
const LABEL = /([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

/** Prometheus text -> Map(name -> [{labels, value}]); comments and lines it cannot read are skipped. */
export function parsePrometheus(text) {
  const series = new Map();
  for (const line of text.split('\n')) {
    const match = line.startsWith('#') ? null : LINE.exec(line);
    if (!match) continue;
    const labels = {};
    for (const [, name, value] of (match[2] || '').matchAll(LABEL)) {
      labels[name] = value.replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    }
    const value = match[3] === '+Inf' ? Infinity : match[3] === '-Inf' ? -Infinity : Number(match[3]);
    if (!series.has(match[1])) series.set(match[1], []);
    series.get(match[1]).push({ labels, value });
  }
  return series;
}

/** The sum of `name` over its label sets (those `keep(labels)` keeps); null when the server has none. */
export function total(series, name, keep = () => true) {
  const kept = (series.get(name) || []).filter((s) => keep(s.labels));
  return kept.length ? kept.reduce((sum, s) => sum + s.value, 0) : null;
}

// What the Lab shows: gauges (now, and their peak while a run lasts), counters (their change over a
// run; shown with this many decimals), histograms (their mean over a run: the change of _sum over the
// change of _count, times the scale).
export const GAUGES = [
  ['qtts_active_streams', 'active streams'],
  ['qtts_queue_depth', 'waiting for a slot'],
  ['qtts_free_slots', 'free slots'],
  ['qtts_websocket_sessions', 'open sockets'],
];
export const COUNTERS = [
  ['qtts_speech_streams_total', 'streams finished', 0],
  ['qtts_audio_seconds_total', 'audio made (s)', 2],
];
export const HISTOGRAMS = [
  ['qtts_time_to_first_audio_seconds', 'mean first audio (ms)', 1000],
  ['qtts_real_time_factor', 'mean real-time factor', 1],
];

/** The figures of one scrape: every GAUGES and COUNTERS series' total, each HISTOGRAMS' _sum and _count. */
export function figures(text) {
  const series = parsePrometheus(text);
  const out = {};
  for (const [name] of [...GAUGES, ...COUNTERS]) out[name] = total(series, name);
  for (const [name] of HISTOGRAMS) {
    out[`${name}_sum`] = total(series, `${name}_sum`);
    out[`${name}_count`] = total(series, `${name}_count`);
  }
  return out;
}

/** A histogram's mean between two scrapes (times `scale`), or null when nothing was observed between them. */
export function meanBetween(before, after, name, scale = 1) {
  const count = (after[`${name}_count`] ?? 0) - (before[`${name}_count`] ?? 0);
  return count > 0 ? (((after[`${name}_sum`] ?? 0) - (before[`${name}_sum`] ?? 0)) / count) * scale : null;
}
