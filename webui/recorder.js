// Microphone recording for "New voice": getUserMedia -> AudioWorklet -> 16-bit mono WAV (lossless, any
// browser's capture rate; the server resamples). No MediaRecorder: its WebM/Opus would work too, but a
// WAV keeps the clip exactly as captured and its length is known to the sample.

import { wavBlob } from './player.js';

export const MAX_RECORD_S = 30; // the server's limit for a reference clip

export class Recorder {
  constructor({ onLevel = () => {}, onLimit = () => {} } = {}) {
    this.onLevel = onLevel;   // (peak 0..1, seconds) while recording
    this.onLimit = onLimit;   // MAX_RECORD_S reached: the caller should call stop()
    this.ctx = null;
    this.stream = null;
    this.node = null;
    this.chunks = [];
    this.samples = 0;
    this.stopping = false;
    this.limited = false; // MAX_RECORD_S reached
  }

  get recording() { return this.ctx !== null; }

  /** Ask for the microphone and start capturing (rejects with a readable message). */
  async start() {
    if (this.recording) return;
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new Error('Recording needs a secure page: open the console over https or on localhost.');
    }
    try {
      this.stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false } });
    } catch (e) {
      throw new Error(e.name === 'NotAllowedError' ? 'Microphone access was denied.'
        : e.name === 'NotFoundError' ? 'No microphone was found.' : `The microphone could not be opened (${e.message}).`);
    }
    const ctx = new AudioContext({ latencyHint: 'interactive' });
    try {
      await ctx.audioWorklet.addModule(new URL('./capture-worklet.js', import.meta.url));
      if (ctx.state === 'suspended') await ctx.resume();
      const source = ctx.createMediaStreamSource(this.stream);
      const node = new AudioWorkletNode(ctx, 'qtts-capture', { numberOfInputs: 1, numberOfOutputs: 1 });
      const mute = ctx.createGain(); // keeps the node pulled by the graph without playing the mic back
      mute.gain.value = 0;
      source.connect(node).connect(mute).connect(ctx.destination);
      this.chunks = [];
      this.samples = 0;
      this.limited = false;
      node.port.onmessage = (e) => this.take(e.data, ctx.sampleRate);
      this.ctx = ctx;
      this.node = node;
    } catch (e) {
      this.release(ctx);
      throw new Error(`Recording could not start (${e.message}).`);
    }
  }

  take(block, rate) {
    if (!this.recording || this.limited) return;
    const room = Math.round(MAX_RECORD_S * rate) - this.samples;
    const part = block.length > room ? block.subarray(0, room) : block;
    this.chunks.push(part);
    this.samples += part.length;
    let peak = 0;
    for (let i = 0; i < part.length; i++) peak = Math.max(peak, Math.abs(part[i]));
    this.onLevel(peak, this.samples / rate);
    if (room <= block.length) { this.limited = true; this.onLimit(); }
  }

  /** Stop; resolves to {blob (audio/wav), seconds, rate, peak} (null when not recording or already stopping). */
  async stop() {
    const ctx = this.ctx;
    if (!ctx || this.stopping) return null;
    this.stopping = true;
    try {
      await new Promise((resolve) => { // the worklet's last partial block
        this.node.port.onmessage = (e) => { this.take(e.data, ctx.sampleRate); resolve(); };
        this.node.port.postMessage('flush');
        setTimeout(resolve, 250);
      });
    } finally {
      this.release(ctx);
      this.stopping = false;
    }
    const pcm = new Int16Array(this.samples);
    let at = 0;
    let peak = 0;
    for (const chunk of this.chunks) {
      for (let i = 0; i < chunk.length; i++) {
        const v = Math.max(-1, Math.min(1, chunk[i]));
        peak = Math.max(peak, Math.abs(v));
        pcm[at++] = Math.round(v * 32767);
      }
    }
    this.chunks = [];
    return { blob: wavBlob(pcm, ctx.sampleRate), seconds: pcm.length / ctx.sampleRate, rate: ctx.sampleRate, peak };
  }

  release(ctx) {
    if (this.stream) for (const track of this.stream.getTracks()) track.stop();
    this.stream = null;
    this.node = null;
    this.ctx = null;
    ctx.close().catch(() => {});
  }
}
