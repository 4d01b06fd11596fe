"""The web console (webui/) in headless Chromium, driven by Playwright, against a real server.

Debian's `chromium` (/usr/bin/chromium; `.ci/run` installs it) is used as is: `playwright install`
would download a browser. The page exposes `window.__qtts` (samples handed to its AudioContext,
chunks, time to first audio, requests, WebSocket events, errors shown), which is what the tests read.
Screenshots go to test-artifacts/ (gitignored).
"""

from __future__ import annotations

import contextlib
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import pytest

from tests.conftest import CHROMIUM
from tests.server_fixtures import server_fixtures

pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
KEY = "console-key"
SAMPLES_PER_FRAME = 1920
WAIT_MS = 30_000

pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian chromium is not installed")


registry, server = server_fixtures(4, api_key=KEY, webui_dir=ROOT / "webui")


@pytest.fixture
def page(browser, server):
    context = browser.new_context(base_url=server.url, accept_downloads=True,
                                  viewport={"width": 1280, "height": 860})
    context.set_default_timeout(10_000)
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}")
            if not r.url.endswith("/v1/audio/speech") else None)  # Stop aborts a speech request
    page.goto("/")
    # the server wants a key: the page says so, then loads the pickers once it has one
    page.wait_for_function("window.__qtts && window.__qtts.errors.length > 0", timeout=WAIT_MS)
    assert page.evaluate("window.__qtts.errors[0].status") == 401
    page.fill("#api-key", KEY)
    page.press("#api-key", "Enter")
    page.wait_for_function("window.__qtts.ready", timeout=WAIT_MS)
    assert page.locator("#error").is_hidden()
    yield page
    context.close()
    assert not problems, problems


@contextlib.contextmanager
def console_with_key(browser, server, key: str, **options) -> Iterator:
    """The console at `server` in a browser context of its own (`options`: viewport, permissions, ...) whose key
    field remembers `key`, loaded: pickers filled, no error shown. On exit, no page error or failed request
    happened."""
    context = browser.new_context(base_url=server.url, **options)
    context.set_default_timeout(10_000)
    context.add_init_script(f"localStorage.setItem('qtts.apiKey', '{key}')")  # the key field's memory
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.goto("/")
    try:
        page.wait_for_function("window.__qtts && window.__qtts.ready", timeout=WAIT_MS)
        assert page.locator("#error").is_hidden()
        yield page
    finally:
        context.close()
    assert not problems, problems


def qtts(page, expression: str):
    return page.evaluate(f"(q => {expression})(window.__qtts)")


def set_fields(page, **values: str) -> None:
    for field, value in values.items():
        page.fill(f"#{field}", value)


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


def test_the_page_speaks_a_sentence_and_the_wav_is_what_the_server_sent(page, server):
    models = page.locator("#model option").all_inner_texts()
    assert models and not any(m.startswith("tts-1") for m in models)  # aliases are not listed twice
    assert "ryan" in page.locator("#voice option").evaluate_all("os => os.map(o => o.value)")
    languages = page.locator("#language option").evaluate_all("os => os.map(o => o.value)")
    assert languages[0] == "auto" and "english" in languages  # from the model card: no dialects
    assert not any("dialect" in language for language in languages)
    assert page.locator("#instructions").is_enabled()  # the card: the 1.7B-like test model takes instructions
    page.click("#new-voice > summary")  # no Base model here: the page says cloning needs one
    assert "needs a Base model" in page.inner_text("#nv-unavailable") and page.locator("#nv-create").is_disabled()
    page.select_option("#voice", "ryan")
    set_fields(page, seed="5", **{"max-frames": "12"})
    page.click("#speak")
    page.wait_for_function("window.__qtts.requests.at(-1)?.finish === 'complete'", timeout=WAIT_MS)
    assert qtts(page, "q.scheduledSamples") == 12 * SAMPLES_PER_FRAME
    assert qtts(page, "q.chunks") >= 2  # streamed: the engine's chunks are 1, 2, 4, 8 frames
    assert qtts(page, "q.audioContext.state") == "running"
    assert page.inner_text("#ttfa").endswith(" ms") and qtts(page, "q.ttfaMs") > 0
    assert page.inner_text("#rtf").endswith("×")
    assert page.locator("#history tbody tr").count() == 1
    # the text as it is spoken: the SSE progress events, shown as the player reaches their audio
    page.wait_for_function("window.__qtts.progress?.basis === 'final'", timeout=WAIT_MS)
    final = qtts(page, "q.progress")
    text = page.input_value("#text")
    assert page.inner_text("#spoken") == text and 0 < final["text_fed_end"] <= len(text)
    assert page.inner_text("#spoken .said") == text[:final["spoken_end_estimate"]]
    assert qtts(page, "q.requests.at(-1).usage.output_tokens") == 12
    with page.expect_download() as download:
        page.click("#download")
    wav = Path(download.value.path()).read_bytes()
    assert wav[:4] == b"RIFF" and wav[8:16] == b"WAVEfmt " and struct.unpack("<I", wav[24:28])[0] == 24000
    response = httpx.post(f"{server.url}/v1/audio/speech", headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                          json={"model": page.input_value("#model"), "input": page.input_value("#text"),
                                "voice": "ryan", "language": "auto", "response_format": "pcm", "seed": 5,
                                "max_frames": 12})
    assert wav[44:] == response.content


def test_speak_as_i_type_speaks_before_the_text_is_finished(page):
    page.fill("#text", "")
    page.locator("label.switch").click()
    assert page.is_checked("#live-mode") and page.locator("#speak").is_hidden()
    set_fields(page, seed="3", **{"max-frames": "40", "pause-ms": "20000"})
    first, rest = "Hello there, this is", " a live typing test."
    page.locator("#text").press_sequentially(first, delay=15)
    page.wait_for_function("window.__qtts.live.state === 'speaking' && window.__qtts.scheduledSamples > 0",
                           timeout=WAIT_MS)
    assert page.input_value("#text") == first  # audio came while the sentence was unfinished
    assert qtts(page, "q.live.charsAtFirstAudio") <= len(first)
    assert qtts(page, "q.requests.at(-1).finish") == "running"
    page.locator("#text").press_sequentially(rest, delay=15)
    page.press("#text", "Enter")  # finish speaking
    page.wait_for_function("['max_frames', 'eos'].includes(window.__qtts.requests.at(-1)?.finish)",
                           timeout=WAIT_MS)
    request = qtts(page, "q.requests.at(-1)")
    assert request["mode"] == "live" and request["text"] == first + rest
    assert request["samples"] == qtts(page, "q.scheduledSamples") > 0
    assert request["ttfaMs"] > 0 and page.inner_text("#ttfa").endswith(" ms")
    events = qtts(page, "q.events")
    assert [e["type"] for e in events if e["type"] != "progress"] == ["started", "done"]
    # the text as it is spoken: progress events shown as the player reaches their audio
    final = [e for e in events if e["type"] == "progress"][-1]
    assert final["basis"] == "final"
    page.wait_for_function("window.__qtts.progress?.basis === 'final'", timeout=WAIT_MS)
    assert page.inner_text("#spoken .said") == (first + rest)[:final["spoken_end_estimate"]]
    assert page.inner_text("#spoken") == first + rest
    assert page.input_value("#text") == first + rest  # Enter finished the sentence, it added no newline
    page.wait_for_timeout(300)  # let the spectrum view draw the playing audio
    print(f"screenshot: {screenshot(page, 'webui-console.png')}")


def test_server_errors_are_shown_in_the_page(page):
    # POST /v1/audio/speech answers 400 for a voice the model does not have
    page.evaluate("""() => {
        const select = document.querySelector('#voice');
        select.append(new Option('nobody', 'nobody'));
        select.value = 'nobody';
    }""")
    page.click("#speak")
    page.wait_for_selector("#error:not([hidden])", timeout=WAIT_MS)
    assert "Voice 'nobody' is not available" in page.inner_text("#error-message")
    assert "400" in page.inner_text("#error-code") and "voice" in page.inner_text("#error-code")
    assert qtts(page, "q.requests.at(-1).finish") == "error"
    page.click("#error-close")
    assert page.locator("#error").is_hidden()
    # the WebSocket's `error` event is shown too
    page.fill("#text", "")
    page.locator("label.switch").click()
    page.locator("#text").press_sequentially("H")
    page.wait_for_function("window.__qtts.live.state === 'idle' && window.__qtts.errors.length === 3",
                           timeout=WAIT_MS)  # the 401 before the key, the 400, this one
    assert page.locator("#error").is_visible()
    assert "Voice 'nobody' is not available" in page.inner_text("#error-message")
    assert qtts(page, "q.errors.at(-1).code") == "invalid_value"
    request = qtts(page, "q.requests.at(-1)")
    assert (request["mode"], request["text"], request["finish"]) == ("live", "H", "error")
    print(f"screenshot: {screenshot(page, 'webui-error.png')}")
