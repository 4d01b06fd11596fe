// Qwen3-TTS-X console: the panels' modules wired together. Pickers from the API (voices.js), "New voice"
// (new-voice.js), "Speak" over POST /v1/audio/speech (speak.js), "Speak as I type" over the WebSocket
// /v1/ws (live.js), the request history (requests.js); shared pieces in page.js and api.js, playback and
// the live view in player.js and highlight.js. Tests read window.__qtts (page.js, stats).

import { apiKey } from './api.js';
import { cancelLive, closeSocket } from './live.js';
import { renderNewVoice } from './new-voice.js';
import { $, player, showError, store } from './page.js';
import { wavBlob } from './player.js';
import { renderDownload } from './requests.js';
import { cancelSpeak, speak } from './speak.js';
import { loadModels } from './voices.js';

const reload = () => loadModels(renderNewVoice);

/** Stop everything: the HTTP request, the live utterance, the audio playing. */
function stopAll() {
  cancelSpeak();
  cancelLive();
  player.stop();
  renderDownload();
}

$('speak').addEventListener('click', () => {
  player.ensure();
  const text = $('text').value;
  if (!text.trim()) { showError({ message: 'Type some text first.' }, 'Nothing to say'); return; }
  stopAll();
  speak(text);
});
$('stop').addEventListener('click', stopAll);
$('download').addEventListener('click', () => {
  const link = document.createElement('a');
  link.href = URL.createObjectURL(wavBlob(player.heard()));
  link.download = `qwen3-tts-${new Date().toISOString().replace(/[:.]/g, '-')}.wav`;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
});

$('api-key').value = store.get('apiKey') || '';
$('api-key').addEventListener('change', () => { store.set('apiKey', apiKey()); closeSocket(); reload(); });

reload();
