// An LLM-like token feed for the Lab's race: a reply cut into pieces the size of an LLM's tokens, handed
// out at a steady rate, and the points where its sentences are complete.

// A space and up to 6 letters or digits (a long word is several tokens, as BPE cuts it), one or two CJK
// characters, one other mark, or trailing spaces: every character of the text is in exactly one token.
const TOKEN = /\s*[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}]{1,2}|\s*[\p{L}\p{N}\p{M}'’]{1,6}|\s*\S|\s+/gu;

// The end of a sentence: its mark (and closing quotes or brackets) once the next token shows a space
// after it ("3.5" or "e.g." mid-sentence are not ends); a CJK full stop ends one at once.
const SENTENCE_END = /[.!?…]+["'”’)\]]*\s|[。！？]+["'”’)\]」』]*/u;

/** The tokens of `text`, in order; joined they are `text`. */
export const llmTokens = (text) => text.match(TOKEN) || [];

/** Where the first complete sentence of `text` after `from` ends (the index after it), or -1. */
export function sentenceEnd(text, from) {
  const match = SENTENCE_END.exec(text.slice(from));
  return match ? from + match.index + match[0].length : -1;
}

const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

/** Hand `tokens` out at `rate` per second, the first at once: `onToken(token, index, at)` at each one's time
 * (`at`: performance.now()). Stops early when `signal` aborts. */
export async function paceTokens(tokens, rate, onToken, signal) {
  const t0 = performance.now();
  for (let i = 0; i < tokens.length; i++) {
    const wait = t0 + (i * 1000) / rate - performance.now();
    if (wait > 0) await sleep(wait);
    if (signal.aborted) return;
    onToken(tokens[i], i, performance.now());
  }
}
