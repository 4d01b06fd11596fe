"""The web console's Lab and dialogue panel in headless Chromium (Debian's, driven by Playwright) against a
real uvicorn with the tiny random model: the race (both first-audio times measured, the timeline drawn,
what was played equal to what the server makes), N concurrent streams with their real-time factors beside
the server's /metrics, the event trace (table, JSON downloaded and copied), and the dialogue panel (bad
lines named in the panel; a script played through POST /v1/text-to-dialogue/stream).

Screenshots go to $QTTS_TEST_ARTIFACTS when it is set, else to the test's tmp_path (the path is printed).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from qwen3_tts_gguf.model.settings import EngineSettings

from api.limits import ServerLimits
from tests.conftest import CHROMIUM
from tests.server_fixtures import server_fixtures
from tests.test_env_config import gauge
from tests.test_webui import ROOT, SAMPLES_PER_FRAME, WAIT_MS, console_with_key, qtts
from tests.waiting import wait_until
from tests.ws_helpers import httpx

pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian chromium is not installed")

KEY = "lab-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
REPLY = "Hello there. This is a race!"
SENTENCES = ["Hello there.", "This is a race!"]
SEED = 3

# the runaway budget (6 frames + 1 per text token) ends every stream within a second or two of audio:
# random weights rarely say EOS, and the dialogue route has no max_frames
registry, server = server_fixtures(
    settings=EngineSettings(threads=1, deterministic=True, max_streams=4, max_pending=4, budget_base_frames=6,
                            budget_frames_per_token=1),
    api_key=KEY, webui_dir=ROOT / "webui", limits=ServerLimits(max_requests_per_client=4))


@pytest.fixture
def artifacts(tmp_path) -> Path:
    folder = Path(os.environ.get("QTTS_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def page(browser, server):
    with console_with_key(browser, server, KEY, accept_downloads=True, viewport={"width": 1280, "height": 900},
                          permissions=["clipboard-read", "clipboard-write"]) as page:
        page.select_option("#voice", "ryan")
        page.fill("#seed", str(SEED))
        yield page


def screenshot(page, folder: Path, name: str, selector: str) -> Path:
    path = folder / name
    page.locator(selector).screenshot(path=str(path))
    print(f"screenshot: {path}")
    return path


def run_lab(page, button: str, part: str) -> dict:
    if page.locator("#lab").get_attribute("open") is None:
        page.click("#lab > summary")
    page.click(button)
    page.wait_for_function(f"window.__qtts.lab.state === 'idle' && window.__qtts.lab.{part}", timeout=60_000)
    assert page.locator("#error").is_hidden(), page.inner_text("#error")
    return qtts(page, f"q.lab.{part}")


def speech_pcm(server, model: str, text: str) -> bytes:
    response = httpx.post(f"{server.url}/v1/audio/speech", headers=AUTH, timeout=60,
                          json={"model": model, "input": text, "voice": "ryan", "response_format": "pcm",
                                "seed": SEED, "language": "auto"})
    assert response.status_code == 200, response.text
    return response.content


def test_the_race_measures_both_lanes_and_draws_their_timelines(page, server, artifacts):
    page.click("#lab > summary")
    page.fill("#lab-text", REPLY)
    page.fill("#lab-rate", "100")
    race = run_lab(page, "#lab-race-run", "race")
    token, sentence = race["lanes"]["token"], race["lanes"]["sentence"]
    for lane in (token, sentence):
        assert lane["error"] is None
        assert "".join(t["text"] for t in lane["tokens"]) == REPLY  # the same feed, token by token
        times = [t["at"] for t in lane["tokens"]]
        assert times == sorted(times) and times[-1] >= (len(times) - 1) * 10 - 1  # 100 tokens/s
        assert 0 < lane["firstAudioMs"] <= lane["lastAudioMs"] and lane["firstPlayedMs"] >= lane["firstAudioMs"]
        assert all(c["playAt"] >= c["at"] and c["playEnd"] > c["playAt"] for c in lane["chunks"])
        assert lane["samples"] == sum(c["samples"] for c in lane["chunks"]) > 0
    # token-level: one utterance, its audio all the frames its `done` counted
    assert token["finish"] in ("eos", "max_frames", "budget") and token["requests"] == []
    events = qtts(page, "q.lab.trace")
    done = next(e for e in events if e["via"] == "ws" and e["event"] == "done")
    assert token["samples"] == done["detail"]["usage"]["frames"] * SAMPLES_PER_FRAME
    # sentence-level: a request per sentence, sent once the feed completed it, after the one before ended
    assert sentence["finish"] == "complete"
    assert [r["text"] for r in sentence["requests"]] == SENTENCES
    first, second = sentence["requests"]
    assert 0 < first["readyAt"] <= first["sentAt"] < first["firstAudioAt"] <= first["endAt"] <= second["sentAt"]
    assert second["readyAt"] >= sentence["tokens"][-1]["at"]  # the last sentence is complete when the feed ends
    with page.expect_download() as download:  # the console's WAV: the last lane's take, as heard
        page.click("#download")
    heard = Path(download.value.path()).read_bytes()[44:]
    model = page.input_value("#model")
    assert heard == b"".join(speech_pcm(server, model, s) for s in SENTENCES)  # the same requests, from here
    assert sentence["samples"] * 2 == len(heard)
    # the figures and the timeline
    rows = page.locator("#lab-race-figures tbody tr")
    assert rows.count() == 2 and all(" ms" in rows.nth(i).inner_text() for i in range(2))
    drawn = page.evaluate("""() => {
        const c = document.querySelector('#lab-timeline'), g = c.getContext('2d'), dpr = window.devicePixelRatio || 1;
        const inked = (y0, y1) => { const d = g.getImageData(0, y0 * dpr, c.width, (y1 - y0) * dpr).data;
            let n = 0; for (let i = 3; i < d.length; i += 4) n += d[i] > 0; return n; };
        return { tokens: inked(10, 24), tokenPlayed: inked(54, 66), sentencePlayed: inked(100, 112) };
    }""")
    assert min(drawn.values()) > 0, drawn
    # the trace: every message both ways, socket and HTTP, in time order, as the table shows it
    assert {(e["dir"], e["via"], e["event"]) for e in events} >= {
        ("sent", "ws", "start"), ("sent", "ws", "text"), ("sent", "ws", "stop"), ("received", "ws", "started"),
        ("received", "ws", "audio"), ("received", "ws", "done"), ("sent", "http", "POST /v1/audio/speech"),
        ("received", "http", "200 headers"), ("received", "http", "audio"), ("received", "http", "end")}
    assert sum(e["event"] == "text" for e in events) == len(token["tokens"])
    assert [e["t_ms"] for e in events] == sorted(e["t_ms"] for e in events) and events[0]["t_ms"] >= 0
    assert page.locator("#lab-trace tbody tr").count() == len(events)
    with page.expect_download() as download:
        page.click("#lab-trace-download")
    saved = json.loads(Path(download.value.path()).read_text())
    assert saved["run"] == "race" and saved["events"] == events and saved["events_not_kept"] == 0
    page.click("#lab-trace-copy")
    page.wait_for_function("document.querySelector('#lab-trace-copied').textContent === 'copied'")
    assert json.loads(page.evaluate("navigator.clipboard.readText()")) == saved
    screenshot(page, artifacts, "webui-lab-race.png", "#lab")


def test_concurrent_streams_beside_the_server_metrics(page, server, artifacts):
    page.click("#lab > summary")
    page.fill("#lab-text", "One stream of several, running beside the others at once.")
    page.fill("#lab-n", "3")
    run = run_lab(page, "#lab-conc-run", "concurrency")
    streams = run["streams"]
    assert [s["n"] for s in streams] == [1, 2, 3]
    for s in streams:
        assert s["state"] == "complete" and s["error"] is None
        assert s["firstAudioMs"] > 0 and s["audioS"] > 0 and s["chunks"] >= 1
        assert s["rtf"] == pytest.approx(s["wallS"] / s["audioS"]) and s["rtf"] > 0
    before, after = run["metrics"]["before"], run["metrics"]["after"]
    assert after["qtts_speech_streams_total"] - before["qtts_speech_streams_total"] == 3
    assert after["qtts_audio_seconds_total"] - before["qtts_audio_seconds_total"] == pytest.approx(
        sum(s["audioS"] for s in streams), abs=1e-3)
    assert after["qtts_time_to_first_audio_seconds_count"] - before["qtts_time_to_first_audio_seconds_count"] == 3
    assert after["qtts_free_slots"] == 4 and run["metrics"]["peak"]["qtts_free_slots"] == 4
    # the tables: a row per stream with its RTF; the metrics with the server's means over the run
    rows = page.locator("#lab-streams tbody tr")
    assert rows.count() == 3
    assert all(float(rows.nth(i).locator("td").nth(4).inner_text()) > 0 for i in range(3))
    ttfa = page.locator("#lab-metrics tr[data-series='qtts_time_to_first_audio_seconds'] td").last.inner_text()
    rtf = page.locator("#lab-metrics tr[data-series='qtts_real_time_factor'] td").last.inner_text()
    assert float(ttfa) > 0 and float(rtf) > 0
    finished = page.locator("#lab-metrics tr[data-series='qtts_speech_streams_total'] td").last.inner_text()
    assert finished == "+3"
    events = qtts(page, "q.lab.trace")
    assert {e["lane"] for e in events} == {"stream 1", "stream 2", "stream 3", "metrics"}
    assert sum(e["event"] == "end" for e in events) == 3
    assert page.locator("#lab-trace tbody tr").count() == len(events)
    screenshot(page, artifacts, "webui-lab-concurrency.png", "#lab")


def test_a_bad_script_is_named_line_by_line_and_nothing_is_sent(page, artifacts):
    page.wait_for_function("document.querySelector('#dlg-voices').textContent.includes('ryan')")
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if "text-to-dialogue" in r.url else None)
    page.fill("#dlg-script", "ryan: Hello.\nnobody: Hi.\njust some text\n\nryan:   ")
    page.click("#dlg-play")
    page.wait_for_selector("#dlg-error:not([hidden])")
    lines = page.locator("#dlg-error-lines li").all_inner_texts()
    assert lines == ["Line 2: no voice “nobody” here (the voices are listed under the script).",
                     "Line 3: write it as “voice: text” (“just some text” has no colon).",
                     "Line 5: nothing to say after “ryan:”."]
    assert page.inner_text("#dlg-error-title") == "The script has 3 bad lines"
    assert qtts(page, "q.errors.at(-1).where") == "dialogue" and page.locator("#error").is_hidden()
    assert sent == [] and qtts(page, "q.requests.length") == 0
    screenshot(page, artifacts, "webui-dialogue-errors.png", "#dialogue")
    page.fill("#dlg-script", "")
    page.click("#dlg-play")
    page.wait_for_function("document.querySelector('#dlg-error-title').textContent === 'The script has 1 bad line'")
    assert page.locator("#dlg-error-lines li").all_inner_texts() == ["Write at least one line: “voice: text”."]


def test_a_dialogue_plays_as_it_streams_and_is_what_the_route_sends(page, server, artifacts):
    """Needs POST /v1/text-to-dialogue/stream (api/)."""
    page.wait_for_function("document.querySelector('#dlg-voices').textContent.includes('serena')")
    page.fill("#dlg-script", "Ryan: Hi there.\nserena: Hello, Ryan!")  # a voice's name in any case
    page.fill("#dlg-seed", "7")
    page.click("#dlg-play")
    # (the request is listed only once the voices are read again: until then the last request is none, or another's)
    page.wait_for_function("(r => r?.mode === 'dialogue' && r.finish !== 'running')(window.__qtts.requests.at(-1))",
                           timeout=60_000)
    request = qtts(page, "q.requests.at(-1)")
    assert page.locator("#dlg-error").is_hidden(), page.inner_text("#dlg-error")
    assert (request["mode"], request["finish"], request["voice"]) == ("dialogue", "complete", "ryan, serena")
    assert request["ttfaMs"] > 0 and request["samples"] == qtts(page, "q.scheduledSamples") > 0
    assert page.locator("#history tbody tr").first.locator("td").nth(1).inner_text() == "dialogue"
    with page.expect_download() as download:
        page.click("#download")
    wav = Path(download.value.path()).read_bytes()
    assert struct.unpack("<I", wav[24:28])[0] == 24000
    response = httpx.post(f"{server.url}/v1/text-to-dialogue/stream?output_format=pcm_24000", headers=AUTH,
                          timeout=60, json={"inputs": [{"text": "Hi there.", "voice_id": "ryan"},
                                                       {"text": "Hello, Ryan!", "voice_id": "serena"}], "seed": 7})
    assert response.status_code == 200 and wav[44:] == response.content
    screenshot(page, artifacts, "webui-dialogue.png", "#dialogue")
    page.click("#lab > summary")
    path = artifacts / "webui-console-with-lab.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def test_stop_ends_a_race_and_the_server_frees_what_it_held(page, server):
    page.click("#lab > summary")
    page.fill("#lab-rate", "4")  # slow: the race is still feeding tokens when Stop comes
    page.click("#lab-race-run")
    page.wait_for_function("window.__qtts.lab.race?.lanes.token.tokens.length >= 2", timeout=WAIT_MS)
    page.click("#lab-stop")
    page.wait_for_function("window.__qtts.lab.state === 'idle'", timeout=WAIT_MS)
    assert page.inner_text("#lab-status") == "race: stopped" and page.locator("#error").is_hidden()
    race = qtts(page, "q.lab.race")
    assert race["lanes"]["sentence"]["tokens"] == [] and race["lanes"]["token"]["error"] is None
    assert qtts(page, "q.lab.trace.at(-1).event") == "close"
    assert ("sent", "cancel") in {(e["dir"], e["event"]) for e in qtts(page, "q.lab.trace")}
    wait_until(lambda: all(gauge(httpx.get(f"{server.url}/metrics", timeout=10).text, name) == 0
                           for name in ("qtts_websocket_sessions", "qtts_active_streams")), "the race's stream freed")
    assert page.locator("#lab-race-run").is_enabled() and page.locator("#lab-stop").is_disabled()

