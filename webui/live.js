// "Speak as I type": the WebSocket /v1/ws, fed the text as it is typed.
// idle -> starting (start sent) -> speaking (started) -> stopping (stop sent) -> idle (done)
// Text typed while starting or stopping waits in `pending`; it opens the next utterance after `done`.

import { ApiError, openSocket } from './api.js';
import { s16 } from './player.js';
import { $, clearError, player, setPill, showError, spoken, stats } from './page.js';
import { finishRequest, gotAudio, newRequest, renderRequest } from './requests.js';
import { speechFields } from './voices.js';

const live = { ws: null, connecting: null, state: 'idle', sent: '', pending: '', timer: null, req: null,
  stopAfterStart: false };

const liveOn = () => $('live-mode').checked;

function setLiveState(state) {
  live.state = state;
  stats.live.state = liveOn() ? state : 'off';
  const pill = $('live-state');
  pill.hidden = !liveOn();
  setPill(pill, state, { speaking: 'ok', starting: 'busy', stopping: 'busy', cancelling: 'busy' }[state] || '');
}

function connect() {
  if (live.ws && live.ws.readyState === WebSocket.OPEN) return Promise.resolve(live.ws);
  if (live.connecting) return live.connecting;
  const ws = openSocket('/v1/ws', 'qtts.v1');
  live.connecting = new Promise((resolve, reject) => {
    ws.onopen = () => { live.ws = ws; live.connecting = null; resolve(ws); };
    ws.onerror = () => { /* onclose follows with the code */ };
    ws.onclose = (e) => {
      live.connecting = null;
      if (live.ws === ws) live.ws = null;
      const wasBusy = live.state !== 'idle';
      if (e.code !== 1000 && e.code !== 1005 && (wasBusy || !ws.sawError)) {
        showError({ message: `The WebSocket closed (code ${e.code}${e.reason ? `: ${e.reason}` : ''}).` }, 'Connection lost');
      }
      if (live.req) finishRequest(live.req, 'error');
      live.req = null;
      live.pending = '';
      setLiveState('idle');
      reject(new Error(`WebSocket closed (${e.code})`));
    };
  });
  ws.onmessage = (e) => {
    if (typeof e.data === 'string' && e.data.includes('"type":"error"')) ws.sawError = true;
    onSocketMessage(e.data);
  };
  live.connecting.catch(() => {});
  return live.connecting;
}

/** Close the socket (the API key changed: the next utterance connects with the new one). */
export function closeSocket() {
  if (live.ws) live.ws.close(1000);
  live.ws = null;
}

function sendJSON(message) {
  if (live.ws && live.ws.readyState === WebSocket.OPEN) live.ws.send(JSON.stringify(message));
}

function onSocketMessage(data) {
  const req = live.req;
  if (typeof data !== 'string') {
    if (!req || live.state === 'cancelling') return; // audio of a cancelled utterance
    if (req.ttfaMs == null) stats.live.charsAtFirstAudio = stats.live.sentChars;
    gotAudio(req, s16(new Uint8Array(data)), req.firstTextAt ?? req.t0);
    return;
  }
  const event = JSON.parse(data);
  stats.events.push(event);
  if (event.type === 'started') {
    setLiveState('speaking');
    if (live.pending) sendText(live.pending);
    live.pending = '';
    if (live.stopAfterStart) finishLive();
  } else if (event.type === 'error') {
    showError(new ApiError(event.error.message, event.error));
    if (live.state === 'starting') { // the start was refused: nothing runs, the typed text is dropped
      if (req) { req.text = live.pending; finishRequest(req, 'error'); }
      live.req = null;
      live.pending = '';
      setLiveState('idle');
    }
  } else if (event.type === 'progress') {
    if (req && live.state !== 'cancelling') spoken.add(event);
  } else if (event.type === 'done') {
    if (req) {
      req.usage = event.usage;
      const compute = event.timings && event.timings.compute_s;
      finishRequest(req, event.finish_reason, event.audio_s ? compute / event.audio_s : null);
    }
    live.req = null;
    setLiveState('idle');
    if (liveOn() && live.pending.trim()) startLive();
  }
}

async function startLive() {
  clearError();
  player.newTake();
  spoken.reset();
  live.req = newRequest('live', '');
  live.stopAfterStart = false;
  setLiveState('starting');
  try {
    const ws = await connect();
    ws.send(JSON.stringify({ type: 'start', format: 'pcm', progress: true, ...speechFields() }));
  } catch (e) {
    if (live.req) { showError({ message: e.message }, 'Connection failed'); finishRequest(live.req, 'error'); }
    live.req = null;
    setLiveState('idle');
  }
}

function sendText(text) {
  const req = live.req;
  if (req.firstTextAt == null) req.firstTextAt = performance.now();
  req.text += text;
  spoken.setText(req.text);
  stats.live.sentChars += text.length;
  renderRequest(req);
  sendJSON({ type: 'text', text });
}

function addDelta(delta) {
  if (live.state === 'speaking') { sendText(delta); return; }
  live.pending += delta;
  if (live.state === 'idle' && live.pending.trim()) startLive();
}

/** Finish speaking what was typed (a pause, Enter, or leaving typing mode). */
function finishLive() {
  clearTimeout(live.timer);
  if (live.state === 'speaking') { setLiveState('stopping'); sendJSON({ type: 'stop' }); }
  else if (live.state === 'starting') live.stopAfterStart = true;
}

/** Cancel the utterance in progress, if any: typed text not yet sent is dropped, late audio ignored. */
export function cancelLive() {
  if (['starting', 'speaking', 'stopping'].includes(live.state)) {
    live.pending = '';
    setLiveState('cancelling');
    sendJSON({ type: 'cancel' });
  }
}

$('text').addEventListener('input', () => {
  if (!liveOn()) return;
  const value = $('text').value;
  let common = 0; // text edited behind the end cannot be taken back: only what is new is spoken
  while (common < live.sent.length && common < value.length && live.sent[common] === value[common]) common++;
  const delta = value.slice(common);
  live.sent = value;
  if (delta) addDelta(delta);
  clearTimeout(live.timer);
  const pause = Math.max(200, parseInt($('pause-ms').value, 10) || 1200);
  live.timer = setTimeout(finishLive, pause);
});

$('text').addEventListener('keydown', (e) => {
  if (liveOn() && e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); finishLive(); }
});

$('live-mode').addEventListener('change', () => {
  live.sent = $('text').value; // what is already there is not spoken; new typing is
  live.pending = '';
  document.body.classList.toggle('live', liveOn());
  if (liveOn()) { player.ensure(); connect().catch(() => {}); $('text').focus(); } else finishLive();
  setLiveState(live.state);
});

document.body.classList.toggle('live', liveOn());
setLiveState('idle');
