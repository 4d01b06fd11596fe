// Playback through WebAudio: one AudioContext, chunks of 24 kHz s16le PCM scheduled back to back (no gaps,
// no clicks), an AnalyserNode for a live view, and a record of what was heard (the WAV of it).

export const SAMPLE_RATE = 24000;
const LEAD_S = 0.06; // head start for the first chunk (and after an underrun)

/** s16le bytes -> Int16Array (copied, so any byte offset works). */
export function s16(bytes) {
  const out = new Int16Array(bytes.byteLength >> 1);
  new Uint8Array(out.buffer).set(bytes.subarray(0, out.length * 2));
  return out; // little-endian hosts (all browsers in practice)
}

/** A 16-bit mono WAV file: the samples exactly as the server sent them. */
export function wavBlob(samples, rate = SAMPLE_RATE) {
  const header = new DataView(new ArrayBuffer(44));
  const text = (at, s) => { for (let i = 0; i < s.length; i++) header.setUint8(at + i, s.charCodeAt(i)); };
  text(0, 'RIFF'); header.setUint32(4, 36 + 2 * samples.length, true); text(8, 'WAVE');
  text(12, 'fmt '); header.setUint32(16, 16, true); header.setUint16(20, 1, true); header.setUint16(22, 1, true);
  header.setUint32(24, rate, true); header.setUint32(28, 2 * rate, true); header.setUint16(32, 2, true);
  header.setUint16(34, 16, true); text(36, 'data'); header.setUint32(40, 2 * samples.length, true);
  return new Blob([header.buffer, samples.buffer.slice(samples.byteOffset, samples.byteOffset + samples.byteLength)],
                  { type: 'audio/wav' });
}

export class PcmPlayer {
  /** `stats`: an object whose scheduledSamples, chunks, underruns and audioContext it keeps up to date. */
  constructor(stats = { scheduledSamples: 0, chunks: 0, underruns: 0, audioContext: null }) {
    this.stats = stats;
    this.ctx = null;
    this.sources = new Set();
    this.nextTime = 0;
    this.take = [];       // Int16Array chunks of the current take, as received
    this.takeStart = null; // context time the take began playing
    this.takeSamples = 0;
    this.cutAt = null;    // samples heard when playback was stopped
  }

  /** The context (created on first use, at 24 kHz where the browser allows it). */
  ensure() {
    if (!this.ctx) {
      try {
        this.ctx = new AudioContext({ sampleRate: SAMPLE_RATE, latencyHint: 'interactive' });
      } catch {
        this.ctx = new AudioContext({ latencyHint: 'interactive' }); // buffers are resampled by the browser
      }
      this.gain = this.ctx.createGain();
      this.analyser = this.ctx.createAnalyser();
      this.analyser.fftSize = 2048;
      this.analyser.smoothingTimeConstant = 0.75;
      this.gain.connect(this.analyser);
      this.analyser.connect(this.ctx.destination);
    }
    if (this.ctx.state === 'suspended') this.ctx.resume();
    this.stats.audioContext = { state: this.ctx.state, sampleRate: this.ctx.sampleRate };
    return this.ctx;
  }

  get playing() {
    return this.ctx !== null && this.nextTime > this.ctx.currentTime;
  }

  /** Start a new take (what the WAV download holds) unless audio is still playing. */
  newTake() {
    if (this.playing) return;
    this.take = [];
    this.takeSamples = 0;
    this.takeStart = null;
    this.cutAt = null;
  }

  /** Schedule s16 samples (an Int16Array) right after the previous chunk. */
  enqueue(samples, rate = SAMPLE_RATE) {
    if (!samples.length) return;
    const ctx = this.ensure();
    const buffer = ctx.createBuffer(1, samples.length, rate);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < samples.length; i++) channel[i] = samples[i] / 32767; // inverse of the server's rule
    const source = ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.gain);
    const now = ctx.currentTime;
    if (this.nextTime < now + 0.005) { // nothing queued (first chunk) or the queue ran dry
      if (this.nextTime > 0 && this.take.length) this.stats.underruns++;
      this.nextTime = now + LEAD_S;
    }
    if (this.takeStart === null) this.takeStart = this.nextTime;
    source.start(this.nextTime);
    this.nextTime += samples.length / rate;
    this.sources.add(source);
    source.onended = () => this.sources.delete(source);
    this.take.push(samples);
    this.takeSamples += samples.length;
    this.stats.scheduledSamples += samples.length;
    this.stats.chunks++;
  }

  /** Schedule s16le bytes (pcm audio as the server sends it). */
  play(bytes) { this.enqueue(s16(bytes)); }

  /** Silence now; the take keeps what was heard. */
  stop() {
    if (this.ctx && this.takeStart !== null && this.playing) {
      this.cutAt = Math.max(0, Math.floor((this.ctx.currentTime - this.takeStart) * SAMPLE_RATE));
    }
    for (const source of this.sources) {
      try { source.stop(); } catch { /* already stopped */ }
    }
    this.sources.clear();
    this.nextTime = 0;
  }

  /** The samples of the take that were (or are being) heard. */
  heard() {
    const n = this.cutAt === null ? this.takeSamples : Math.min(this.cutAt, this.takeSamples);
    const out = new Int16Array(n);
    let at = 0;
    for (const chunk of this.take) {
      if (at >= n) break;
      const part = chunk.subarray(0, Math.min(chunk.length, n - at));
      out.set(part, at);
      at += part.length;
    }
    return out;
  }
}
