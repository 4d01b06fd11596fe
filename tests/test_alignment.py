"""api/speaking/alignment.py: characters given once each, in order, spread over their piece's audio; the
shapes ElevenLabs' socket and HTTP routes send (end to end: tests/test_elevenlabs.py)."""

from __future__ import annotations

import pytest

from api.speaking.alignment import CharTimeline


def test_each_piece_carries_the_characters_its_estimate_reached_once_and_in_order():
    timeline = CharTimeline("Hello there")
    first = timeline.piece(0.08, None)  # no progress known: no characters, the clock still moves
    assert first.chars == "" and first.socket_shape() is None and first.http_shape() is None
    second = timeline.piece(0.16, 5)
    assert second.chars == "Hello" and second.piece_start == pytest.approx(0.08)
    assert second.socket_shape() == {"chars": list("Hello"), "charStartTimesMs": [0, 32, 64, 96, 128],
                                     "charDurationsMs": [32] * 5}
    assert second.http_shape() == {"characters": list("Hello"),
                                   "character_start_times_seconds": [0.08, 0.112, 0.144, 0.176, 0.208],
                                   "character_end_times_seconds": [0.112, 0.144, 0.176, 0.208, 0.24]}
    assert timeline.piece(0.08, 3).chars == ""  # an estimate never gives a character twice
    timeline.text += ", you"  # live text grows while it speaks
    third = timeline.piece(0.32, 99)  # beyond the text: up to its end
    assert third.chars == " there, you" and third.piece_start == pytest.approx(0.32)
    shape = third.socket_shape()
    assert sum(shape["charDurationsMs"]) == 320 and shape["charStartTimesMs"][0] == 0


def test_the_rest_comes_at_the_end_of_the_audio_with_no_duration():
    timeline = CharTimeline("One two three.")
    assert timeline.piece(0.24, 3).chars == "One"
    rest = timeline.rest(len("One two three."))
    assert rest.chars == " two three." and all(t == pytest.approx(0.24) for t in rest.starts + rest.ends)
    assert rest.socket_shape()["charDurationsMs"] == [0] * len(rest.chars)
    assert timeline.rest(None).chars == "" and timeline.rest(5).chars == ""
