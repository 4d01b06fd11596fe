// Types of the Qwen3-TTS-X browser SDK (index.js). Events and fields: docs/protocols.md.

/** A server's error, from OpenAI's envelope {"error": {message, type, param, code}}. */
export declare class ApiError extends Error {
  constructor(message: string, fields?: { status?: number | null; code?: string | null; type?: string | null;
    param?: string | null });
  status: number | null;
  code: string | null;
  type: string | null;
  param: string | null;
  static fromEvent(error: ErrorObject | null | undefined): ApiError;
}

/** The error object of an envelope or an `error` event. */
export interface ErrorObject {
  message: string;
  type?: string | null;
  param?: string | null;
  code?: string | null;
}

/** The error a failed fetch Response carries. */
export declare function apiError(response: Response): Promise<ApiError>;

export declare const SAMPLE_RATE: 24000;

/** s16le bytes -> samples (copied). */
export declare function s16(bytes: Uint8Array): Int16Array;

/** A 16-bit mono WAV file of the samples. */
export declare function wavBlob(samples: Int16Array, rate?: number): Blob;

export interface PlayerStats {
  scheduledSamples: number;
  chunks: number;
  underruns: number;
  audioContext: { state: string; sampleRate: number } | null;
}

/** WebAudio playback of 24 kHz s16le PCM, chunks back to back. */
export declare class PcmPlayer {
  constructor(stats?: PlayerStats);
  stats: PlayerStats;
  ctx: AudioContext | null;
  analyser?: AnalyserNode;
  readonly playing: boolean;
  /** The AudioContext (made on first use; call it from a user gesture so the page may play). */
  ensure(): AudioContext;
  /** Start a new take (what `heard` returns) unless audio is still playing. */
  newTake(): void;
  enqueue(samples: Int16Array, rate?: number): void;
  /** Schedule s16le bytes, as the server sends pcm. */
  play(bytes: Uint8Array): void;
  stop(): void;
  /** The samples of the take that were (or are being) heard. */
  heard(): Int16Array;
}

/** base64 -> bytes. */
export declare function fromBase64(text: string): Uint8Array;

export interface ConnectOptions {
  /** The server's base URL (absolute, or relative to the page; default: the page's folder). */
  baseUrl?: string | URL;
  /** The API key (sent as a subprotocol, or as ?api_key= when it cannot be one). */
  apiKey?: string;
  /** A WebSocket implementation (default: the global one). */
  WebSocket?: typeof WebSocket;
}

export interface OpenSocketOptions extends ConnectOptions {
  protocol?: string;
  keyProtocol?: string;
  query?: Record<string, string | number | boolean | null | undefined>;
}

/** A WebSocket (not yet open) to the server's socket `path`; binary messages as ArrayBuffers. */
export declare function openSocket(path: string, options?: OpenSocketOptions): WebSocket;

/** A JSON event from the server (`type` and its fields). */
export interface ServerEvent {
  type: string;
  [field: string]: unknown;
}

export interface SpeakCallbacks {
  onAudio?: ((bytes: Uint8Array) => void) | null;
  onEvent?: ((event: ServerEvent) => void) | null;
}

/** What every socket of the SDK shares. */
export declare class SpeechSocket {
  protected constructor(ws: WebSocket);
  readonly ws: WebSocket;
  onevent: ((event: ServerEvent) => void) | null;
  onaudio: ((bytes: Uint8Array) => void) | null;
  onclose: ((code: number, reason: string) => void) | null;
  lastError: ErrorObject | null;
  readonly closed: Promise<{ code: number; reason: string }>;
  readonly isOpen: boolean;
  send(message: object): void;
  close(code?: number, reason?: string): Promise<{ code: number; reason: string }>;
}

/** The speech request's fields a `start` takes (docs/protocols.md, WebSocket /v1/ws). */
export interface UtteranceFields {
  voice?: string | { id: string };
  model?: string;
  format?: 'mp3' | 'opus' | 'aac' | 'flac' | 'wav' | 'pcm';
  instructions?: string;
  language?: string;
  seed?: number;
  temperature?: number;
  top_k?: number;
  top_p?: number;
  repetition_penalty?: number;
  max_frames?: number;
  speed?: number;
  resumable?: boolean;
  progress?: boolean;
  text_normalization?: string;
  [field: string]: unknown;
}

/** The `done` event of an utterance. */
export interface DoneEvent extends ServerEvent {
  type: 'done';
  id: string;
  finish_reason: 'eos' | 'max_frames' | 'budget' | 'cancelled' | 'error' | string;
  audio_s: number;
  usage: Record<string, number | null>;
}

/** The qtts.v1 socket, /v1/ws. */
export declare class QttsSocket extends SpeechSocket {
  static connect(options?: ConnectOptions): Promise<QttsSocket>;
  start(fields?: UtteranceFields): void;
  text(text: string, seq?: number): void;
  stop(): void;
  cancel(): void;
  ack(audioBytes: number): void;
  /** One utterance of `text`; resolves with its `done` event. */
  speak(text: string, fields?: UtteranceFields, callbacks?: SpeakCallbacks): Promise<DoneEvent>;
}

export interface RealtimeConnectOptions extends ConnectOptions {
  /** This server's model id or alias (default: its default model). */
  model?: string;
}

/** OpenAI's Realtime API for speech, /v1/realtime. */
export declare class RealtimeSocket extends SpeechSocket {
  static connect(options?: RealtimeConnectOptions): Promise<RealtimeSocket>;
  /** `session.update` (type "realtime" added); resolves with `session.updated`. */
  updateSession(session: Record<string, unknown>): Promise<ServerEvent>;
  /** Speak `text` as a user message's response; resolves with `response.done`. */
  speak(text: string, options?: SpeakCallbacks & { response?: Record<string, unknown> | null }): Promise<ServerEvent>;
  append(delta: string): void;
  commit(): void;
  cancel(): void;
}

/** The server's base URL, ending in "/" (a trailing /v1 dropped). */
export declare function serverBase(base?: string | URL | null): URL;
/** The URL of `path` on the server. */
export declare function httpUrl(path: string, base?: string | URL | null): URL;
/** The ws(s):// URL of the socket `path` on the server. */
export declare function socketUrl(path: string, base?: string | URL | null,
  query?: Record<string, string | number | boolean | null | undefined>): URL;
