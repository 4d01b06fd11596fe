"""The talker prompt, row for row as the official `generate` builds it (model notes §3).

A prompt is a list of input rows (width H) for the prefill, plus `trailing` text rows that are
added to the frame embeddings of the first decode steps (streaming text mode), and the `<tts_pad>`
row used once they run out. Rows are sums of a text part (E_txt) and a codec part (C):

    [instruction rows]                      text only, when the model takes an instruction
    role rows  <|im_start|> assistant \\n    text only
    tag rows   PAD + C(tag)...  [PAD + S]    S = named speaker (CustomVoice) or x-vector (Base)
               BOS + C(codec_pad)
    body       non-streaming: E_txt(t) + C(pad) for every token, EOS + C(pad), PAD + C(codec_bos)
               streaming:     E_txt(t0) + C(codec_bos); trailing = E_txt(t1..) ++ EOS
An in-context clone puts its reference transcript before the text and pairs the text track with
codec_bos + one row per reference frame instead of codec_bos alone (`reference_track`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qwen3_tts_gguf.model.embeddings import EmbeddingTables
from qwen3_tts_gguf.model.manifest import Manifest
from qwen3_tts_gguf.model.tokenizer import TextTokenizer

TEXT_MODES = ("non-streaming", "streaming")


class PromptError(ValueError):
    """A request the model cannot take (unknown speaker or language, empty text, ...)."""


class ContextLengthExceeded(PromptError):
    """The prompt (instructions + text + voice reference) cannot fit one stream's talker context.
    `param` names what to shorten: "instructions" (with the voice reference, the part that does not
    depend on the text) or "input"."""

    def __init__(self, message: str, param: str = "input"):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, eq=False)
class ReferencePrompt:
    """An in-context clone's reference: its transcript and its codec codes [T, 16]."""

    text: str
    codes: np.ndarray


@dataclass(frozen=True, eq=False)
class VoiceSpec:
    """Who speaks and how: a named speaker, an x-vector (+ reference), an instruction, a language."""

    speaker: str | None = None  # CustomVoice speaker name
    speaker_embedding: np.ndarray | None = None  # Base x-vector [H]
    instruct: str | None = None
    language: str = "auto"
    reference: ReferencePrompt | None = None  # in-context clone (Base models)


class TrailingRows:
    """Text rows that trail a streaming-mode prompt, one per decode step: E_txt of `ids`, then
    `last` (the EOS row). A row is projected when its step asks for it, so a request's first audio
    never waits for the projection of text it speaks later. `np.asarray` gives all rows [M, H]."""

    def __init__(self, tables: EmbeddingTables, ids: list[int], last: np.ndarray):
        self._tables, self._ids, self._last = tables, list(ids), last

    def __len__(self) -> int:
        return len(self._ids) + 1

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._last if i == len(self._ids) else self._tables.text_rows([self._ids[i]])[0]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        rows = np.concatenate([self._tables.text_rows(self._ids), self._last[None]])
        return rows if dtype is None else rows.astype(dtype)


@dataclass
class Prompt:
    rows: np.ndarray  # [L, H] prefill rows
    trailing: np.ndarray | TrailingRows  # [M, H] text rows added to decode steps 0..M-1
    pad_row: np.ndarray  # [H] text part of every later decode step
    text_tokens: int  # number of text tokens of the body (usage accounting)
    prefix_len: int = 0  # leading rows that depend only on the voice (rows[:prefix_len] == prefix_rows)
    text_ends: list[int] | None = None  # per body token: end (code points) of the text read with it

    def body_in_prefill(self) -> int:
        """Body tokens the prefill reads (the rest trail, one per decode step); may be negative
        when a clone's reference transcript outlasts the prefill."""
        trailing = len(self.trailing)
        return self.text_tokens if trailing == 0 else self.text_tokens - (trailing - 1)


def resolve_language(manifest: Manifest, voice: VoiceSpec) -> int | None:
    """The codec language id of the tag rows (None = auto/nothink), with the dialect override."""
    language = (voice.language or "auto").lower()
    if language != "auto" and (language not in manifest.languages or "dialect" in language):
        valid = ["auto"] + sorted(k for k in manifest.languages if "dialect" not in k)
        raise PromptError(f"unknown language {voice.language!r}; valid: {', '.join(valid)}")
    language_id = None if language == "auto" else manifest.languages[language]
    if voice.speaker is not None and language in ("chinese", "auto"):
        dialect = manifest.speakers[voice.speaker.lower()]["dialect"]
        if dialect:
            language_id = manifest.languages[dialect]
    return language_id


def check_speaker(manifest: Manifest, speaker: str | None) -> str | None:
    """Normalise a speaker name; raises PromptError listing the valid ones."""
    if speaker is None or speaker == "":
        return None
    if not manifest.speakers:
        raise PromptError(f"model {manifest.name} ({manifest.model_type}) has no named speakers")
    if speaker.lower() not in manifest.speakers:
        raise PromptError(f"unknown speaker {speaker!r}; valid: {', '.join(manifest.speakers)}")
    return speaker.lower()


class PromptBuilder:
    """Builds prompts for one converted model."""

    def __init__(self, manifest: Manifest, tokenizer: TextTokenizer, tables: EmbeddingTables):
        self.manifest = manifest
        self.tokenizer = tokenizer
        self.tables = tables
        ids = manifest.text_ids
        self.pad_row, self.bos_row, self.eos_row = tables.text_rows([ids["tts_pad"], ids["tts_bos"], ids["tts_eos"]])

    def text_ids(self, text: str) -> list[int]:
        """Body token ids, sliced from the official assistant template (ids[3:-5])."""
        ids = self.tokenizer.encode(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")
        return ids[3:-5]

    def text_ids_with_ends(self, text: str) -> tuple[list[int], list[int]]:
        """`text_ids` and, per token, the end in `text` (code points) of the text read with it."""
        role = "<|im_start|>assistant\n"
        ids, ends = self.tokenizer.encode_with_ends(f"{role}{text}<|im_end|>\n{role}")
        return ids[3:-5], [min(max(e - len(role), 0), len(text)) for e in ends[3:-5]]

    def body_ids(self, text: str) -> list[int]:
        """`text_ids` of a text that must say something; raises PromptError for empty text."""
        return self._body(text)[0]

    def _body(self, text: str) -> tuple[list[int], list[int]]:
        body, ends = self.text_ids_with_ends(text) if text.strip() else ([], [])
        if not body:
            raise PromptError("input text is empty")
        return body, ends

    def role_ids(self) -> list[int]:
        return self.tokenizer.encode("<|im_start|>assistant\n")[:3]

    def instruct_ids(self, instruct: str) -> list[int]:
        return self.tokenizer.encode(f"<|im_start|>user\n{instruct}<|im_end|>\n")

    def prefix_rows(self, voice: VoiceSpec) -> np.ndarray:
        """The text-independent rows: instruction, role, tags, speaker, BOS + codec_pad."""
        m, c = self.manifest, self.manifest.codec_ids
        speaker = check_speaker(m, voice.speaker)
        language_id = resolve_language(m, VoiceSpec(speaker=speaker, language=voice.language))
        if language_id is None:
            tags = [c["nothink"], c["think_bos"], c["think_eos"]]
        else:
            tags = [c["think"], c["think_bos"], language_id, c["think_eos"]]
        codec = list(self.tables.codec_rows(tags))
        if speaker is not None:
            codec.append(self.tables.codec_rows([m.speakers[speaker]["id"]])[0])
        elif voice.speaker_embedding is not None:
            emb = np.asarray(voice.speaker_embedding, np.float32).reshape(-1)
            if emb.shape[0] != self.tables.hidden_size:
                raise PromptError(f"speaker embedding has width {emb.shape[0]}, model needs {self.tables.hidden_size}")
            codec.append(emb)
        codec.append(self.tables.codec_rows([c["pad"]])[0])
        text = [self.pad_row] * (len(codec) - 1) + [self.bos_row]
        parts = []
        if voice.instruct and m.instruct_supported:
            parts.append(self.tables.text_rows(self.instruct_ids(voice.instruct)))
        parts.append(self.tables.text_rows(self.role_ids()))
        parts.append(np.stack(text) + np.stack(codec))
        return np.concatenate(parts).astype(np.float32)

    def fixed_rows(self, voice: VoiceSpec) -> int:
        """Prompt rows that do not depend on the text (`prefix_rows` + the codec track of
        `reference_track`), counted without projecting any row; validates the voice like them."""
        m = self.manifest
        speaker = check_speaker(m, voice.speaker)
        language_id = resolve_language(m, VoiceSpec(speaker=speaker, language=voice.language))
        rows = (3 if language_id is None else 4) + 1  # tags, then codec_pad
        rows += int(speaker is not None or voice.speaker_embedding is not None)
        rows += len(self.role_ids())
        if voice.instruct and m.instruct_supported:
            rows += len(self.instruct_ids(voice.instruct))
        if voice.reference is not None:
            rows += len(self.ref_text_ids(voice.reference.text))
            rows += np.asarray(voice.reference.codes).reshape(-1, 16).shape[0]
        return rows + 1  # codec_bos

    def ref_text_ids(self, ref_text: str) -> list[int]:
        """Reference transcript ids, sliced from the official template (ids[3:-2])."""
        return self.tokenizer.encode(f"<|im_start|>assistant\n{ref_text}<|im_end|>\n")[3:-2]

    def reference_track(self, voice: VoiceSpec) -> tuple[list[int], np.ndarray]:
        """(text ids before the body, codec rows the text track is paired with).

        Plain voices: ([], [C(codec_bos)]). In-context clones: the reference transcript, and
        codec_bos + one frame embedding per reference frame, as the official
        `generate_icl_prompt` pairs them.
        """
        codec_bos = self.tables.codec_rows([self.manifest.codec_ids["bos"]])
        if voice.reference is None:
            return [], codec_bos
        if voice.speaker_embedding is None:
            raise PromptError("an in-context clone needs the reference speaker embedding")
        codes = np.asarray(voice.reference.codes, np.int64).reshape(-1, 16)
        return self.ref_text_ids(voice.reference.text), np.concatenate([codec_bos, self.tables.frame_rows(codes)])

    def build(self, text: str, voice: VoiceSpec, text_mode: str) -> Prompt:
        """The full prompt for `text` in `text_mode` ("non-streaming" | "streaming").

        Text rows (reference transcript if any + text + EOS) meet codec rows (`reference_track`):
        non-streaming puts all text rows (+ codec_pad) before the codec rows (+ <tts_pad>);
        streaming pairs the first len(codec rows) text rows with them (padding with <tts_pad> when
        the text is shorter) and the rest trail, one per decode step.
        """
        if text_mode not in TEXT_MODES:
            raise PromptError(f"unknown text mode {text_mode!r}; choose non-streaming or streaming")
        body, ends = self._body(text)
        prefix = self.prefix_rows(voice)
        ref_ids, codec_rows = self.reference_track(voice)
        ids, paired = ref_ids + body, len(codec_rows)
        trailing = np.zeros((0, prefix.shape[1]), np.float32)
        if text_mode == "streaming" and len(ids) >= paired:  # text outlasts the codec rows: the rest trails
            rows = np.concatenate([prefix, self.tables.text_rows(ids[:paired]) + codec_rows])
            trailing = TrailingRows(self.tables, ids[paired:], self.eos_row)
        else:
            text_rows = np.concatenate([self.tables.text_rows(ids), self.eos_row[None]])
            if text_mode == "non-streaming":
                codec_pad = self.tables.codec_rows([self.manifest.codec_ids["pad"]])[0]
                rows = np.concatenate([prefix, text_rows + codec_pad, codec_rows + self.pad_row])
            else:
                pad = np.repeat(self.pad_row[None], paired - len(text_rows), 0)
                rows = np.concatenate([prefix, np.concatenate([text_rows, pad]) + codec_rows])
        return Prompt(rows=rows.astype(np.float32), trailing=trailing, pad_row=self.pad_row,
                      text_tokens=len(body), prefix_len=len(prefix), text_ends=ends)
