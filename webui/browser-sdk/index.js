// Qwen3-TTS-X browser SDK: the qtts.v1 socket (/v1/ws), OpenAI's Realtime API (/v1/realtime), playback
// through WebAudio, and the server's URLs and errors. The protocols: docs/protocols.md. The web console is
// built on these modules; a server hands them out as an npm package under /sdk/.
//
//   import { PcmPlayer, QttsSocket } from 'qwen3-tts-x';
//   const player = new PcmPlayer();
//   const socket = await QttsSocket.connect({ baseUrl: 'https://example.com/tts/', apiKey });
//   await socket.speak('Hello there!', { voice: 'ryan' }, { onAudio: (bytes) => player.play(bytes) });

export { ApiError, apiError } from './errors.js';
export { PcmPlayer, SAMPLE_RATE, s16, wavBlob } from './player.js';
export { RealtimeSocket, fromBase64 } from './realtime.js';
export { QttsSocket, SpeechSocket, openSocket } from './socket.js';
export { httpUrl, serverBase, socketUrl } from './urls.js';
