"""Agreement of greedy codes and of audio between two runtimes, without pytest (`scripts/gpu_check.py` uses
it on a GPU machine that may lack pytest): codes equal up to a near tie of the official float64 logits,
and an SNR."""

from __future__ import annotations

import numpy as np


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    """Decibels of `reference` over its difference from `other` (inf when equal)."""
    with np.errstate(divide="ignore"):
        return float(10 * np.log10(np.sum(reference ** 2) / np.sum((reference - other) ** 2)))


NEAR_TIE = 5e-3
"""A code where the official implementation's float64 logits put the first two candidates closer than
this may be picked either way by two float32 renderings (measured: a gap of 0.0025 on the tiny Base
model, 0.0032 on a 0.6B random net); llama.cpp's code_gen and ONNX Runtime sum in different orders."""


def assert_greedy_codes_agree(actual: np.ndarray, expected: np.ndarray, inputs: list, checkpoint, *,
                              same_talker: bool = True) -> None:
    """Equal codes, or equal up to a first difference that is a near tie of the official float64 logits
    (teacher-forced at that frame from the talker state our stream had: found in `inputs`, what `recording`
    saw). `same_talker`: the expected codes came from the same talker states to float tolerance, so they
    hold the float64 argmax there and ours the runner-up; False (the talker on another device, or stepped
    beside other streams): the two codes are the float64 top two, either way round."""
    from qwen3_tts_gguf.convert.checkpoint import Checkpoint
    from qwen3_tts_gguf.convert.numpy_reference import code_predictor_logits

    assert actual.shape == expected.shape
    differ = np.argwhere(actual != expected)
    if not len(differ):
        return
    frame, book = differ[0]
    assert book >= 1, f"codebook 0 differs at frame {frame}: the talker's, not the code predictor's"
    hidden, code0 = stream_inputs(inputs, actual)[frame]
    ckpt = Checkpoint.open(checkpoint)
    logits = code_predictor_logits(ckpt.weights, ckpt.config, hidden, code0, list(actual[frame, 1:]))[book - 1]
    top = np.argsort(logits)[::-1][:2]
    gap = float(logits[top[0]] - logits[top[1]])
    assert gap < NEAR_TIE, f"frame {frame}, codebook {book}: no near tie (float64 gap {gap:.4f})"
    picked = (int(expected[frame, book]), int(actual[frame, book]))
    if same_talker:
        assert picked == tuple(top), f"frame {frame}, codebook {book}: {picked}, float64 top two {tuple(top)}"
    else:
        assert set(picked) == set(top), f"frame {frame}, codebook {book}: {picked}, float64 top two {tuple(top)}"


def recording(engine) -> list:
    """Every row the engine's code predictor is given from now on, in order: (hidden, code 0, its 15 codes)."""
    rows, predict = [], engine.model.predictor.predict

    def spy(hidden, code0, params, rngs=None, rand=None):
        out = predict(hidden, code0, params, rngs=rngs, rand=rand)
        rows.extend((h.copy(), int(c), codes.copy()) for h, c, codes in zip(hidden, code0, out.codes))
        return out

    engine.model.predictor.predict = spy
    return rows


def stream_inputs(rows: list, codes: np.ndarray) -> list:
    """The (hidden, code 0) each frame of one stream's `codes` [frames, 16] was predicted from, out of the
    `recording` rows (other streams' rows among them): each frame's is the next row that made its codes."""
    inputs, at = [], 0
    for frame in codes:
        while at < len(rows) and not (rows[at][1] == frame[0] and np.array_equal(rows[at][2], frame[1:])):
            at += 1
        assert at < len(rows), "a frame whose code predictor call was not recorded"
        inputs.append(rows[at][:2])
        at += 1
    return inputs
