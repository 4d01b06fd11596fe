// Playback for the console: one AudioContext, chunks scheduled back to back (no gaps, no clicks),
// an AnalyserNode for the live view, and a record of what was heard for the WAV download.

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

export class Player {
  constructor(stats) {
    this.stats = stats; // window.__qtts: scheduledSamples, chunks, underruns
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

/** Spectrum bars (log frequency axis) with the waveform over them; idles as a flat line. */
export class Scope {
  constructor(canvas, player) {
    this.canvas = canvas;
    this.player = player;
    this.freq = null;
    this.wave = null;
    this.frame = this.frame.bind(this);
    requestAnimationFrame(this.frame);
  }

  frame() {
    const { canvas } = this;
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(canvas.clientWidth * dpr));
    const h = Math.max(1, Math.round(canvas.clientHeight * dpr));
    if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
    const g = canvas.getContext('2d');
    const css = getComputedStyle(canvas);
    g.clearRect(0, 0, w, h);
    const analyser = this.player.analyser;
    if (analyser) {
      if (!this.freq) {
        this.freq = new Uint8Array(analyser.frequencyBinCount);
        this.wave = new Float32Array(analyser.fftSize);
      }
      analyser.getByteFrequencyData(this.freq);
      analyser.getFloatTimeDomainData(this.wave);
      const bars = Math.min(96, Math.floor(w / (4 * dpr)));
      const gap = dpr;
      const bw = w / bars;
      const bins = this.freq.length;
      const grad = g.createLinearGradient(0, h, 0, 0);
      grad.addColorStop(0, css.getPropertyValue('--viz-low').trim() || '#3b82f6');
      grad.addColorStop(1, css.getPropertyValue('--viz-high').trim() || '#a855f7');
      g.fillStyle = grad;
      for (let i = 0; i < bars; i++) {
        const lo = Math.floor(Math.pow(bins, i / bars)), hi = Math.max(lo + 1, Math.floor(Math.pow(bins, (i + 1) / bars)));
        let peak = 0;
        for (let k = lo; k < hi && k < bins; k++) peak = Math.max(peak, this.freq[k]);
        const bh = (peak / 255) * h * 0.92;
        g.fillRect(i * bw + gap / 2, h - bh, bw - gap, bh);
      }
    }
    g.strokeStyle = css.getPropertyValue('--viz-wave').trim() || '#111827';
    g.lineWidth = 1.5 * dpr;
    g.beginPath();
    const n = this.wave ? this.wave.length : 2;
    for (let i = 0; i < n; i++) {
      const y = h / 2 - (this.wave ? this.wave[i] : 0) * h * 0.45;
      const x = (i / (n - 1)) * w;
      i ? g.lineTo(x, y) : g.moveTo(x, y);
    }
    g.stroke();
    requestAnimationFrame(this.frame);
  }
}
