// The SDK panel: the packages this server hands out (GET sdk/index.json: the Python client's wheel, the
// browser SDK's npm package, each with its sha256) and the exact commands to install and use them here,
// built from the page's own address (location), so that they are right behind a proxy's path prefix too.

import { apiKey } from './api.js';
import { httpUrl, serverBase, socketUrl } from './browser-sdk/index.js';
import { $, showError } from './page.js';

const KEY_NOTE = 'YOUR_API_KEY';

/** The commands and snippets for this server, from its base URL and the listed files. */
export function sdkCommands(files, base = serverBase(), voice = 'alloy') {
  const wheel = files.find((f) => f.kind === 'python');
  const npm = files.find((f) => f.kind === 'npm');
  const key = apiKey() ? `"${KEY_NOTE}"` : 'None';
  const jsKey = apiKey() ? `'${KEY_NOTE}'` : 'undefined';
  const ws = socketUrl('v1', base).href;
  return {
    pip: wheel && `pip install ${httpUrl(`sdk/${wheel.url}`, base).href}`,
    npm: npm && `npm install ${httpUrl(`sdk/${npm.url}`, base).href}`,
    python: `from qtts_client import Client\n\nwith Client("${base.href}", api_key=${key}) as client:\n`
      + `    wav = client.speak("Hello there!", voice="${voice}", format="wav")\n`
      + `    for event in client.stream_text(["Hello ", "there!"], voice="${voice}"):\n        print(event)`,
    js: `import { PcmPlayer, QttsSocket } from 'qwen3-tts-x';\n\n`
      + `const player = new PcmPlayer(); // player.ensure() in a click handler: audio starts on a gesture\n`
      + `const socket = await QttsSocket.connect({ baseUrl: '${base.href}', apiKey: ${jsKey} });\n`
      + `await socket.speak('Hello there!', { voice: '${voice}' }, { onAudio: (bytes) => player.play(bytes) });`,
    openai: `OpenAI(base_url="${httpUrl('v1', base).href}", websocket_base_url="${ws}", api_key=${key})`,
  };
}

function show(id, text) {
  $(id).textContent = text || 'not served here';
}

/** Fill the panel (when it is opened): the files and their checksums, the commands. */
export async function renderSdk() {
  let files;
  try {
    const response = await fetch('sdk/index.json');
    if (!response.ok) throw new Error(`GET sdk/index.json: ${response.status}`);
    ({ files } = await response.json());
  } catch (e) {
    showError({ message: e.message }, 'Could not list the SDKs');
    return;
  }
  const commands = sdkCommands(files, serverBase(), $('voice').value || 'alloy');
  for (const [name, text] of Object.entries(commands)) show(`sdk-${name}`, text);
  $('sdk-files').replaceChildren(...files.map((f) => {
    const row = document.createElement('tr');
    const link = document.createElement('a');
    link.href = `sdk/${f.url}`;
    link.textContent = f.name;
    const cells = [link, `${f.installer}`, `${(f.size / 1024).toFixed(1)} KiB`, f.sha256];
    row.append(...cells.map((c) => {
      const cell = document.createElement('td');
      cell.append(c);
      return cell;
    }));
    row.lastChild.className = 'hash';
    return row;
  }));
  $('sdk').dataset.ready = 'true';
}

$('sdk').addEventListener('toggle', () => { if ($('sdk').open) renderSdk(); });
$('sdk').addEventListener('click', (e) => {
  const button = e.target.closest('button[data-copy]');
  if (!button) return;
  const text = $(button.dataset.copy).textContent;
  if (navigator.clipboard) navigator.clipboard.writeText(text).then(() => { button.textContent = 'Copied'; }, () => {});
});
