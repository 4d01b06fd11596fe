// Playback for the console: the browser SDK's player (browser-sdk/player.js: one AudioContext, chunks
// scheduled back to back, what was heard for the WAV download) and the live view of what it plays.

export { PcmPlayer as Player, SAMPLE_RATE, s16, wavBlob } from './browser-sdk/player.js';

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
