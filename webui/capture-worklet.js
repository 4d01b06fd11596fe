// AudioWorklet processor for the console's recorder: the microphone's samples (mixed to mono), posted
// to the page in blocks of about 85 ms (4096 frames) so the page is not woken every 128 frames.

const BLOCK = 4096;

class Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.block = new Float32Array(BLOCK);
    this.filled = 0;
    this.port.onmessage = (e) => { if (e.data === 'flush') this.flush(); };
  }

  flush() {
    if (this.filled) this.port.postMessage(this.block.slice(0, this.filled));
    this.filled = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || !channels.length) return true; // no input yet
    const frames = channels[0].length;
    for (let i = 0; i < frames; i++) {
      let sum = 0;
      for (const channel of channels) sum += channel[i];
      this.block[this.filled++] = sum / channels.length;
      if (this.filled === BLOCK) this.flush();
    }
    return true;
  }
}

registerProcessor('qtts-capture', Capture);
