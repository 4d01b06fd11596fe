// The Lab's event trace: every message a Lab run sends and receives, over the socket and over HTTP, with
// its time from the run's start; shown as a table as it happens, copied or downloaded as JSON.

import { saveBlob } from '../page.js';

export const MAX_TRACE_EVENTS = 5000; // a run keeps its first events; the ones after are only counted
const DETAIL_CHARS = 140;              // of an event's detail shown in its cell (the JSON has all of it)

export class Trace {
  /** `table`: the <table> whose body gets a row per event; `note`: where the count and drops are said. */
  constructor(table, note) {
    this.table = table;
    this.note = note;
    this.begin('none');
  }

  /** Start the trace of a new run (`run`: its name); the previous one is dropped. */
  begin(run) {
    this.run = run;
    this.t0 = performance.now();
    this.startedAt = new Date().toISOString();
    this.events = [];
    this.dropped = 0;
    this.table.tBodies[0].replaceChildren();
    this.renderNote();
  }

  /** One event: `dir` 'sent' or 'received', `via` 'ws' or 'http', `lane` who (a lane, a stream), `event` what;
   * `detail` the message itself (JSON-able). Returns its time (performance.now()). */
  add(dir, via, lane, event, detail = null) {
    const now = performance.now();
    if (this.events.length >= MAX_TRACE_EVENTS) {
      this.dropped++;
      if (this.dropped === 1 || this.dropped % 100 === 0) this.renderNote();
      return now;
    }
    const entry = { t_ms: Math.round((now - this.t0) * 10) / 10, dir, via, lane, event };
    if (detail !== null) entry.detail = detail;
    this.events.push(entry);
    this.renderRow(entry);
    this.renderNote();
    return now;
  }

  renderRow(entry) {
    const detail = entry.detail === undefined ? '' : JSON.stringify(entry.detail);
    const cells = [entry.t_ms.toFixed(1), entry.dir === 'sent' ? '→ sent' : '← received', entry.via, entry.lane,
      entry.event, detail.length > DETAIL_CHARS ? `${detail.slice(0, DETAIL_CHARS - 1)}…` : detail];
    const row = document.createElement('tr');
    row.dataset.dir = entry.dir;
    row.append(...cells.map((c) => { const td = document.createElement('td'); td.textContent = c; return td; }));
    row.lastChild.title = detail;
    this.table.tBodies[0].append(row);
  }

  renderNote() {
    const n = this.events.length;
    this.note.textContent = n ? `${this.run}: ${n} event${n === 1 ? '' : 's'}`
      + (this.dropped ? `, ${this.dropped} more not kept (at most ${MAX_TRACE_EVENTS})` : '') : 'No run yet.';
  }

  /** The trace as one JSON document. */
  json() {
    return JSON.stringify({ run: this.run, started_at: this.startedAt, events: this.events,
      events_not_kept: this.dropped }, null, 1);
  }

  download() {
    saveBlob(new Blob([this.json()], { type: 'application/json' }),
      `qtts-trace-${this.run}-${this.startedAt.replace(/[:.]/g, '-')}.json`);
  }

  /** Copy the JSON to the clipboard (the Clipboard API, else a selected text area); says whether it worked. */
  async copy() {
    const text = this.json();
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch {
      const area = document.createElement('textarea');
      area.value = text;
      document.body.append(area);
      area.select();
      const copied = document.execCommand('copy');
      area.remove();
      return copied;
    }
  }
}
