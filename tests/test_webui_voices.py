"""The web console's voices, in headless Chromium against a real server with a Base model next to a
CustomVoice and a VoiceDesign one (tmp voices folder): model cards, the voice picker (speakers and
profiles), "New voice" by upload, by the microphone (Chromium's fake device: a beep tone) and by
description, speaking with a profile, deleting it, and the server's refusals shown in the page.

Launch flags and helpers come from tests/test_webui.py (Debian chromium, never `playwright install`).
"""

from __future__ import annotations

import io
import shutil

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import pytest
import soundfile

from qwen3_tts_gguf.voicebank.store import VoiceStore

from api.registry import OPENAI_MODEL_ALIASES
from tests.conftest import CHROMIUM
from tests.server_fixtures import FixtureValue, server_fixtures
from tests.test_cli_voices import speechlike
from tests.test_webui import ROOT, SAMPLES_PER_FRAME, WAIT_MS, console_with_key, qtts, screenshot

pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian chromium is not installed")

KEY = "voices-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def wav_bytes(seconds: float, rate: int = 24000, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, speechlike(seconds, rate, seed), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("voices")


registry, server = server_fixtures(4, models=("tiny_cv", "tiny_base", "tiny_vd"), api_key=KEY,
                                   webui_dir=ROOT / "webui", voices_dir=FixtureValue("voices_dir"))


@pytest.fixture
def page(browser, server, voices_dir):
    try:
        with console_with_key(browser, server, KEY, viewport={"width": 1280, "height": 1100}) as page:
            yield page
    finally:
        for name in VoiceStore(voices_dir).list():  # each test starts without profiles
            VoiceStore(voices_dir).delete(name)


def options(page, selector: str) -> list[str]:
    return page.locator(f"{selector} option").evaluate_all("os => os.map(o => o.value)")


def group_of(page, voice: str) -> str:
    return page.locator(f"#voice option[value='{voice}']").evaluate("o => o.parentElement.dataset.kind")


def open_new_voice(page) -> None:
    if page.locator("#new-voice").get_attribute("open") is None:
        page.click("#new-voice > summary")
    assert page.locator("#nv-name").is_visible()


def create_voice(page, name: str, *, wait_error: bool = False) -> None:
    page.fill("#nv-name", name)
    before = qtts(page, "q.voices.created.length + q.errors.length")
    page.click("#nv-create")
    page.wait_for_function(f"(q => q.voices.created.length + q.errors.length > {before})(window.__qtts)",
                           timeout=WAIT_MS)
    if not wait_error:
        assert page.locator("#nv-error").is_hidden(), page.inner_text("#nv-error")


# -- model cards -------------------------------------------------------------------------------------


def test_model_cards_say_what_each_model_is_and_the_console_uses_them(server, registry, page):
    cv, base, vd = registry.models
    cards = {c["id"]: c for c in httpx.get(f"{server.url}/v1/models", headers=AUTH).json()["data"]}
    assert set(cards) == {cv.id, base.id, vd.id, *OPENAI_MODEL_ALIASES}
    card = cards[cv.id]
    assert {k: card[k] for k in ("object", "id", "owned_by", "root")} == {
        "object": "model", "id": cv.id, "owned_by": "qwen3-tts-x", "root": cv.id}
    assert isinstance(card["created"], int)
    assert (card["model_type"], card["model_size"], card["instruct_supported"], card["default_text_mode"]) == (
        "custom_voice", "1.7b", True, "non-streaming")
    assert "english" in card["languages"] and not any("dialect" in lang for lang in card["languages"])
    assert set(cv.manifest.languages) - set(card["languages"]) == {"beijing_dialect", "sichuan_dialect"}
    assert card["speakers"] == list(cv.manifest.speakers) and "ryan" in card["speakers"]
    assert (cards[base.id]["model_type"], cards[base.id]["instruct_supported"], cards[base.id]["speakers"],
            cards[base.id]["default_text_mode"]) == ("base", False, [], "streaming")
    assert cards[vd.id]["model_type"] == "voice_design"
    alias = httpx.get(f"{server.url}/v1/models/tts-1", headers=AUTH).json()
    assert alias["id"] == "tts-1" and alias["root"] == cv.id and alias["model_type"] == "custom_voice"
    assert alias["speakers"] == card["speakers"]
    # the console: languages from the card (no dialects), instructions where the card says so
    page.select_option("#model", cv.id)
    assert options(page, "#language") == ["auto", *card["languages"]]
    assert page.locator("#instructions").is_enabled()
    page.select_option("#model", base.id)  # a Base model without profiles: nothing to pick yet
    assert page.locator("#instructions-field").is_hidden()
    assert options(page, "#voice") == [""] and "New voice" in page.inner_text("#voice")
    page.select_option("#model", vd.id)
    assert page.inner_text("#instructions-label") == "Voice description" and page.locator("#instructions").is_enabled()
    page.select_option("#model", cv.id)


# -- create, speak, delete -----------------------------------------------------------------------------


def test_upload_a_clip_speak_with_the_voice_and_delete_it(server, registry, page, voices_dir):
    cv, base, _ = registry.models
    page.select_option("#model", cv.id)  # a CustomVoice model stays picked: the profile brings its Base model
    open_new_voice(page)
    assert page.locator("#nv-model-field").is_hidden()  # one Base model: nothing to choose
    page.set_input_files("#nv-file", files=[{"name": "alice.wav", "mimeType": "audio/wav",
                                             "buffer": wav_bytes(2.5, seed=1)}])
    page.wait_for_function("document.querySelector('#nv-clip-label').textContent.includes('2.5 s')")
    assert "alice.wav" in page.inner_text("#nv-clip-label")
    page.fill("#nv-text", "Exactly what alice says in the clip.")
    page.select_option("#nv-language", "english")
    create_voice(page, "alice")
    created = qtts(page, "q.voices.created.at(-1)")
    assert (created["id"], created["mode"], created["model"]) == ("alice", "icl", base.id)
    assert VoiceStore(voices_dir).get("alice").language == "english"
    # the picker: refreshed, the new voice selected, in its own group, with the model it speaks with
    assert page.input_value("#voice") == "alice" and group_of(page, "alice") == "profile"
    assert group_of(page, "ryan") == "speaker" and page.input_value("#model") == cv.id
    assert base.id in page.inner_text("#voice-note") and "in-context" in page.inner_text("#voice-note")
    assert page.locator("#voice-delete").is_visible()
    assert page.input_value("#language") == ""  # "as recorded": the profile's own language
    assert "english" in page.inner_text("#language option[value='']")
    assert page.inner_text("#nv-status").startswith("Created “alice”")
    assert page.input_value("#nv-name") == "" and page.locator("#nv-clip").is_hidden()
    page.wait_for_timeout(150)
    print(f"screenshot: {screenshot(page, 'webui-voices.png')}")
    # speak with it: the request goes to the profile's Base model
    page.fill("#seed", "3")
    page.fill("#max-frames", "6")
    with page.expect_request("**/v1/audio/speech") as request:
        page.click("#speak")
    body = request.value.post_data_json
    assert (body["model"], body["voice"]) == (base.id, "alice") and "language" not in body
    page.wait_for_function("window.__qtts.requests.at(-1)?.finish === 'complete'", timeout=WAIT_MS)
    assert qtts(page, "q.scheduledSamples") == 6 * SAMPLES_PER_FRAME
    assert qtts(page, "q.requests.at(-1).model") == base.id
    reference = httpx.post(f"{server.url}/v1/audio/speech", headers=AUTH, timeout=60, json={
        "model": "tts-1", "input": page.input_value("#text"), "voice": "alice", "response_format": "pcm",
        "seed": 3, "max_frames": 6})
    assert reference.headers["x-qwen3tts-model"] == base.id and len(reference.content) == 6 * SAMPLES_PER_FRAME * 2
    # delete it (the page asks first)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#voice-delete")
    page.wait_for_function("window.__qtts.voices.deleted.includes('alice')", timeout=WAIT_MS)
    assert "alice" not in options(page, "#voice") and page.input_value("#voice") != ""
    assert page.locator("#voice-delete").is_hidden()
    assert VoiceStore(voices_dir).list() == []


def test_record_a_clip_with_the_microphone(registry, page, voices_dir):
    """Chromium's fake capture device plays a beep tone; the page records it to a WAV (AudioWorklet)."""
    open_new_voice(page)
    page.click("#nv-record")
    page.wait_for_function("window.__qtts.recording.state === 'recording' && window.__qtts.recording.seconds > 1.6",
                           timeout=WAIT_MS)
    assert page.inner_text("#nv-record-label").startswith("Stop") and page.locator("#nv-meter").is_visible()
    screenshot(page, "webui-voices-recording.png")
    page.click("#nv-record")
    page.wait_for_function("window.__qtts.recording.state === 'done'")
    recording = qtts(page, "q.recording")
    assert recording["seconds"] > 1.6 and recording["peak"] > 0.01  # the beep, not silence
    assert page.inner_text("#nv-clip-label").startswith("Recording") and page.locator("#nv-preview").is_visible()
    create_voice(page, "beep")  # no transcript: an x-vector clone
    assert qtts(page, "q.voices.created.at(-1).mode") == "xvector"
    assert page.input_value("#voice") == "beep" and "x-vector" in page.inner_text("#voice-note")
    profile = VoiceStore(voices_dir).get("beep")
    assert profile.mode == "xvector" and profile.model_size == registry.models[1].manifest.model_size


def test_design_a_voice_from_a_description(registry, page, voices_dir):
    open_new_voice(page)
    page.check("#nv-source-design", force=True)  # the radio is drawn by its label
    assert page.locator("#nv-clip-box").is_hidden() and page.locator("#nv-instructions").is_visible()
    page.fill("#nv-instructions", "A calm, low elderly voice.")
    page.select_option("#nv-language", "english")
    create_voice(page, "narrator")
    assert qtts(page, "q.voices.created.at(-1).mode") == "icl"
    assert page.input_value("#voice") == "narrator"
    assert VoiceStore(voices_dir).get("narrator").mode == "icl"


def test_refusals_are_shown_in_the_form(page, voices_dir):
    open_new_voice(page)
    page.click("#nv-create")  # nothing filled in: the page says what is missing, the server is not asked
    assert page.locator("#nv-error").is_visible() and "name" in page.inner_text("#nv-error-message")
    page.fill("#nv-name", "short")
    page.click("#nv-create")
    assert "Record a clip or choose" in page.inner_text("#nv-error-message")
    # a clip too short for the server: its message, status and param
    page.set_input_files("#nv-file", files=[{"name": "short.wav", "mimeType": "audio/wav",
                                             "buffer": wav_bytes(0.3)}])
    create_voice(page, "short", wait_error=True)
    assert page.locator("#nv-error").is_visible()
    assert "0.30 s long; at least 1 s is needed" in page.inner_text("#nv-error-message")
    assert page.inner_text("#nv-error-code") == "400 · invalid_value · param: audio_sample"
    assert qtts(page, "q.errors.at(-1)")["status"] == 400
    # a name that exists: 409, and the page keeps the clip for a retry with "replace"
    page.set_input_files("#nv-file", files=[{"name": "long.wav", "mimeType": "audio/wav", "buffer": wav_bytes(2.0)}])
    create_voice(page, "bob")
    page.set_input_files("#nv-file", files=[{"name": "long.wav", "mimeType": "audio/wav", "buffer": wav_bytes(2.0)}])
    create_voice(page, "bob", wait_error=True)
    assert "voice 'bob' exists already" in page.inner_text("#nv-error-message")
    assert page.inner_text("#nv-error-code").startswith("409 · voice_exists")
    assert page.locator("#nv-clip").is_visible()
    print(f"screenshot: {screenshot(page, 'webui-voices-error.png')}")
    page.check("#nv-overwrite")
    create_voice(page, "bob")
    assert page.locator("#nv-error").is_hidden() and page.input_value("#voice") == "bob"
    assert VoiceStore(voices_dir).list() == ["bob"]
