// Qwen3-TTS-X console: the panels' modules wired together. Pickers from the API (voices.js), "New voice"
// (new-voice.js), "Speak" over POST /v1/audio/speech (speak.js), "Speak as I type" over the WebSocket
// /v1/ws (live.js), the dialogue panel (dialogue.js), the Lab (lab/lab.js), the SDKs (sdk-page.js), the
// request history (requests.js); shared pieces in page.js and api.js (on the browser SDK, browser-sdk/),
// playback and the live view in player.js and highlight.js. Tests read window.__qtts (page.js, stats).

import { apiKey } from './api.js';
import { renderDialogue, stopDialogue } from './dialogue.js';
import './lab/lab.js';
import { cancelLive, closeSocket } from './live.js';
import { renderNewVoice } from './new-voice.js';
import './sdk-page.js';
import { $, player, saveBlob, showError, store } from './page.js';
import { wavBlob } from './player.js';
import { renderDownload } from './requests.js';
import { cancelSpeak, speak } from './speak.js';
import { loadModels } from './voices.js';

const reload = () => loadModels(() => { renderNewVoice(); renderDialogue(); });

/** Stop everything: the HTTP request, the live utterance, the audio playing. */
function stopAll() {
  cancelSpeak();
  cancelLive();
  stopDialogue();
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
$('download').addEventListener('click', () =>
  saveBlob(wavBlob(player.heard()), `qwen3-tts-${new Date().toISOString().replace(/[:.]/g, '-')}.wav`));

$('api-key').value = store.get('apiKey') || '';
$('api-key').addEventListener('change', () => { store.set('apiKey', apiKey()); closeSocket(); reload(); });

reload();
