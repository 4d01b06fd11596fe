// A streamed HTTP body of raw PCM (s16le mono, 24 kHz) read as it arrives: the Lab's speech streams
// and the dialogue panel. A sample split across two network reads is joined.

import { s16 } from './player.js';

/** Read `response`'s body to its end; `onSamples(Int16Array, bytes)` for each network read with audio. */
export async function readPcmBody(response, onSamples) {
  const reader = response.body.getReader();
  let carry = null; // the first byte of a sample whose second byte is in the next read
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    let bytes = value;
    if (carry !== null) {
      bytes = new Uint8Array(value.length + 1);
      bytes[0] = carry;
      bytes.set(value, 1);
      carry = null;
    }
    if (bytes.length % 2) {
      carry = bytes[bytes.length - 1];
      bytes = bytes.subarray(0, bytes.length - 1);
    }
    if (bytes.length) onSamples(s16(bytes), value.length);
  }
}
