"""Qwen2 byte-level BPE from a checkpoint's vocab.json/merges.txt, tokenizing as the official pipeline.

The official wrapper loads its processor with `fix_mistral_regex=True`; under transformers 4.57.3
that swaps Qwen's pre-tokenizer regex for the "fixed Mistral" one whenever the checkpoint's
config.json has no `transformers_version` or one in (4.57.2, 5.0.0) — the published checkpoints
included. The two regexes split CamelCase differently ("McDonald" -> "Mc" + "Donald"). We
reproduce the official choice per checkpoint (recorded in the manifest at conversion) so the
token ids, and therefore the codes, are the official ones.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
MISTRAL_FIXED_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
    r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
PRETOKENIZERS = {"qwen2": QWEN2_REGEX, "mistral-fixed": MISTRAL_FIXED_REGEX}
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def official_pretokenizer(transformers_version: str | None) -> str:
    """Which regex the official wrapper ends up using for a checkpoint with this config value."""
    if transformers_version:
        v = _version_tuple(transformers_version)
        if v <= (4, 57, 2) or v >= (5, 0, 0):
            return "qwen2"
    return "mistral-fixed"


class TextTokenizer:
    """Text -> token ids, as the official Qwen3-TTS processor produces them."""

    def __init__(self, folder: str | Path, pretokenizer: str = "mistral-fixed"):
        folder = Path(folder)
        if pretokenizer not in PRETOKENIZERS:
            raise ValueError(f"unknown pre-tokenizer {pretokenizer!r}")
        tok = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRETOKENIZERS[pretokenizer]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        config = json.loads((folder / "tokenizer_config.json").read_text())
        added = sorted(config.get("added_tokens_decoder", {}).items(), key=lambda kv: int(kv[0]))
        tokens = []
        for _, spec in added:
            tokens.append(AddedToken(spec["content"], single_word=spec.get("single_word", False),
                                     lstrip=spec.get("lstrip", False), rstrip=spec.get("rstrip", False),
                                     normalized=spec.get("normalized", False), special=spec.get("special", True)))
        tok.add_tokens(tokens)
        for token_id, spec in added:
            if tok.token_to_id(spec["content"]) != int(token_id):
                raise ValueError(f"added token {spec['content']!r} got id {tok.token_to_id(spec['content'])}, "
                                 f"expected {token_id}")
        self._tok = tok
        self.pretokenizer = pretokenizer

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (added tokens such as <|im_start|> are recognised)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_with_ends(self, text: str) -> tuple[list[int], list[int]]:
        """`encode(text)` and, per token, the end (code points) of the text complete once it is read.

        Byte-level BPE may split one character over tokens (an emoji, a ZWJ): a token that ends
        inside a character ends where that character starts. NFC-composed characters are counted
        with the combining marks they absorbed."""
        enc = self._tok.encode(text, add_special_tokens=False)
        offsets = enc.offsets
        ends, last = [], 0
        for i, (_, end) in enumerate(offsets):
            following = offsets[i + 1][0] if i + 1 < len(offsets) else len(text)
            end = min(end, following)
            while end < following and unicodedata.combining(text[end]):
                end += 1
            last = max(last, end)
            ends.append(last)
        return enc.ids, ends

    def pieces(self, text: str) -> list[tuple[str, tuple[int, int]]]:
        """Pre-tokenizer pieces of `text` with their character offsets (BPE never crosses them)."""
        return self._tok.pre_tokenizer.pre_tokenize_str(text)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)
