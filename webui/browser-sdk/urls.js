// Where a Qwen3-TTS-X server's endpoints are: every path is taken relative to the server's base URL, so a
// server behind a path prefix (https://example.com/tts/) is used exactly as one at the root.

/** The server's base URL, ending in "/": `base` (absolute, or relative to the page in a browser; default: the
 * page's folder). A trailing "/v1", as OpenAI clients write it, is dropped; so are a query and a fragment. */
export function serverBase(base) {
  const page = typeof document !== 'undefined' ? document.baseURI : undefined;
  if (base == null && page === undefined) throw new TypeError('baseUrl is required outside a browser page');
  const url = new URL(base == null ? '.' : String(base), page);
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new TypeError(`baseUrl must be an http(s) URL, not ${url.protocol}`);
  }
  url.search = '';
  url.hash = '';
  url.pathname = url.pathname.replace(/\/v1\/?$/, '/').replace(/\/?$/, '/');
  return url;
}

/** The URL of `path` ("v1/audio/speech"; a leading "/" is the server's root, not the host's) on the server. */
export function httpUrl(path, base) {
  return new URL(String(path).replace(/^\/+/, ''), serverBase(base));
}

/** The ws:// or wss:// URL of the socket `path` on the server, with `query` (an object) added. */
export function socketUrl(path, base, query = {}) {
  const url = httpUrl(path, base);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  for (const [name, value] of Object.entries(query)) {
    if (value != null) url.searchParams.set(name, String(value));
  }
  return url;
}
