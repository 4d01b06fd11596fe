"""Text-progress events (opt-in, `"progress": true`): how far the engine has read and spoken the text,
for the audio sent so far. One set of fields for every protocol (docs/protocols.md, "Text progress"):

    {"audio_end_s", "text_fed_end", "spoken_end_estimate", "basis",
     "normalized_text_fed_end", "normalized_spoken_end_estimate"}     (the last two with normalization on)

Each protocol sends them in its own event (`progress` on `/v1/ws`, `speech.progress` in SSE,
`response.output_audio.progress` on `/v1/realtime`), after the audio they describe, and a last one
(basis "final", from the engine's result) before its end-of-audio event.
"""

from __future__ import annotations

from typing import Any

from qwen3_tts_gguf import AudioChunk, SynthesisResult, TextProgress


def progress_fields(progress: TextProgress, audio_s: float, speed: float) -> dict[str, Any]:
    """The event fields: `audio_s` seconds of audio made (at speed 1), as played at `speed`."""
    fields: dict[str, Any] = {
        "audio_end_s": round(audio_s / speed, 4),
        "text_fed_end": progress.text_fed_end,
        "spoken_end_estimate": progress.spoken_end_estimate,
        "basis": progress.basis,
    }
    if progress.normalized_text_fed_end is not None:
        fields["normalized_text_fed_end"] = progress.normalized_text_fed_end
        fields["normalized_spoken_end_estimate"] = progress.normalized_spoken_end_estimate
    return fields


def chunk_progress(chunk: AudioChunk | None, audio_s: float, speed: float) -> dict[str, Any] | None:
    """The fields after `chunk`'s audio (`audio_s`: all audio made so far, at speed 1); None when the
    chunk has none (non-streaming text mode, the encoder's tail)."""
    if chunk is None or chunk.progress is None:
        return None
    return progress_fields(chunk.progress, audio_s, speed)


def final_progress(result: SynthesisResult | None, audio_s: float, speed: float) -> dict[str, Any] | None:
    """The last event's fields (basis "final"), from the engine's result."""
    if result is None or result.progress is None:
        return None
    return progress_fields(result.progress, audio_s, speed)
