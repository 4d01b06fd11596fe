// The text as it is spoken: progress events (docs/protocols.md, "Text progress") mark how far the
// engine has read and spoken; each is shown when the player reaches the audio it came with.

/** Code points (the server's offsets) -> UTF-16 units (JavaScript string indexes) in `text`. */
export function utf16Index(text, codePoints) {
  let units = 0;
  let seen = 0;
  for (const ch of text) {
    if (seen >= codePoints) break;
    units += ch.length;
    seen++;
  }
  return units;
}

export class SpokenText {
  /**
   * @param {HTMLElement} view  where the text is shown (said / read / not yet read)
   * @param {{nextTime: number, ctx: AudioContext|null}} player  the audio's clock and queue end
   * @param {object} stats  window.__qtts: `progress` gets the last event shown
   */
  constructor(view, player, stats) {
    this.view = view;
    this.player = player;
    this.stats = stats;
    this.text = '';
    this.queue = [];   // {at: context time its audio ends, event}
    this.shown = null;
    this.frame = null;
  }

  /** A new utterance: its text so far (more may follow with `setText`). */
  reset(text = '') {
    this.queue = [];
    this.shown = null;
    this.text = text;
    this.stats.progress = null;
    this.render();
  }

  setText(text) {
    this.text = text;
    this.render();
  }

  /** A progress event, right after the audio it describes was queued in the player. */
  add(event) {
    const ctx = this.player.ctx;
    const at = ctx ? Math.max(this.player.nextTime, ctx.currentTime) : 0;
    this.queue.push({ at, event });
    if (this.frame === null) this.frame = requestAnimationFrame(() => this.tick());
  }

  tick() {
    this.frame = null;
    const now = this.player.ctx ? this.player.ctx.currentTime : Infinity;
    let changed = false;
    // the final event (basis "final") shows once all audio before it has been played
    while (this.queue.length && (this.queue[0].at <= now || !this.player.ctx)) {
      this.shown = this.queue.shift().event;
      changed = true;
    }
    if (changed) {
      this.stats.progress = this.shown;
      this.render();
    }
    if (this.queue.length) this.frame = requestAnimationFrame(() => this.tick());
  }

  render() {
    const text = this.text;
    const spoken = this.shown ? utf16Index(text, this.shown.spoken_end_estimate) : 0;
    const fed = this.shown ? Math.max(spoken, utf16Index(text, this.shown.text_fed_end)) : 0;
    const said = document.createElement('span');
    said.className = 'said';
    said.textContent = text.slice(0, spoken);
    const read = document.createElement('span');
    read.className = 'read';
    read.textContent = text.slice(spoken, fed);
    const rest = document.createElement('span');
    rest.textContent = text.slice(fed);
    this.view.replaceChildren(said, read, rest);
    this.view.hidden = !text;
  }
}
