// The race drawn on a canvas, both lanes on one time axis from their first token: the LLM's tokens
// (a sentence's end taller), then per lane each chunk as it arrived (ticks) and as it played (bars),
// sentence requests as they were sent (triangles), and the first audio marked.

const LABEL_W = 112;  // css px of the lane names
const ROWS = [['tokens', 'LLM tokens', 24], ['token', 'token-level', 46], ['sentence', 'sentence-level', 46]];
const AXIS_H = 22;
const STEPS_MS = [20, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000, 20000, 60000];

/** How long the race's timeline is (ms): its last token, request or audio played, and a margin. */
function span(race) {
  let end = 500;
  for (const lane of Object.values(race.lanes)) {
    for (const t of lane.tokens) end = Math.max(end, t.at);
    for (const c of lane.chunks) end = Math.max(end, c.playEnd);
    for (const r of lane.requests) end = Math.max(end, r.sentAt ?? 0, r.endAt ?? 0);
  }
  return end * 1.04;
}

export function drawRace(canvas, race) {
  const dpr = window.devicePixelRatio || 1;
  const cssH = ROWS.reduce((h, [, , rowH]) => h + rowH, 0) + AXIS_H + 8;
  canvas.style.height = `${cssH}px`;
  const w = Math.max(1, Math.round(canvas.clientWidth * dpr));
  const h = Math.round(cssH * dpr);
  if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
  const g = canvas.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  const css = getComputedStyle(canvas);
  if (!race) {
    g.fillStyle = css.getPropertyValue('--muted').trim() || '#667085';
    g.font = '12px system-ui, sans-serif';
    g.fillText('Run the race: its tokens and audio are drawn here as they come.', 12, 24);
    return;
  }
  const color = (name, fallback) => css.getPropertyValue(name).trim() || fallback;
  const ink = color('--muted', '#667085');
  const line = color('--line', '#e3e6ec');
  const laneColor = { token: color('--lane-token', '#5b5bd6'), sentence: color('--lane-sentence', '#d97706') };
  const width = canvas.clientWidth;
  const total = span(race);
  const x = (t) => LABEL_W + (Math.max(0, t) / total) * (width - LABEL_W - 12);
  const plotBottom = ROWS.reduce((y, [, , rowH]) => y + rowH, 4);

  // the time axis
  const step = STEPS_MS.find((s) => total / s <= 8) || STEPS_MS.at(-1);
  g.font = '11px system-ui, sans-serif';
  g.textAlign = 'center';
  for (let t = 0; t <= total; t += step) {
    g.fillStyle = line;
    g.fillRect(Math.round(x(t)), 4, 1, plotBottom - 4);
    g.fillStyle = ink;
    g.fillText(t >= 1000 ? `${t / 1000} s` : `${t} ms`, x(t), plotBottom + 14);
  }

  let top = 4;
  const rowTop = {};
  for (const [key, label, rowH] of ROWS) {
    rowTop[key] = top;
    g.fillStyle = ink;
    g.textAlign = 'left';
    g.fillText(label, 4, top + rowH / 2 + 4);
    g.fillStyle = line;
    g.fillRect(LABEL_W, top + rowH - 1, width - LABEL_W, 1);
    top += rowH;
  }

  // the feed: the tokens of whichever lane has them, the points where a sentence was complete
  const tokens = race.lanes.token.tokens.length ? race.lanes.token.tokens : race.lanes.sentence.tokens;
  g.fillStyle = ink;
  for (const t of tokens) g.fillRect(x(t.at), rowTop.tokens + 8, 1, 10);
  g.fillStyle = laneColor.sentence;
  for (const r of race.lanes.sentence.requests) g.fillRect(x(r.readyAt) - 1, rowTop.tokens + 2, 2, 20);

  for (const key of ['token', 'sentence']) {
    const lane = race.lanes[key];
    const y = rowTop[key];
    g.fillStyle = laneColor[key];
    for (const c of lane.chunks) g.fillRect(x(c.at), y + 4, 1.5, 14); // arrived
    g.globalAlpha = 0.55;
    for (const c of lane.chunks) g.fillRect(x(c.playAt), y + 24, Math.max(1, x(c.playEnd) - x(c.playAt)), 14);
    g.globalAlpha = 1;
    for (const r of lane.requests) { // a sentence's request sent
      if (r.sentAt === null) continue;
      g.beginPath();
      g.moveTo(x(r.sentAt) - 4, y + 1);
      g.lineTo(x(r.sentAt) + 4, y + 1);
      g.lineTo(x(r.sentAt), y + 8);
      g.fill();
    }
    if (lane.firstAudioMs !== null) {
      g.fillRect(x(lane.firstAudioMs), y + 2, 2, 40);
      g.textAlign = 'left';
      g.fillStyle = css.getPropertyValue('--ink').trim() || '#16181d';
      g.fillText(`first audio ${Math.round(lane.firstAudioMs)} ms`, x(lane.firstAudioMs) + 5, y + 16);
    }
  }
}
