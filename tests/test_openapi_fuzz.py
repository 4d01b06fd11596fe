"""The OpenAPI document is the truth: schemathesis, with all its checks, against a live server.

A real uvicorn (`ServerThread`) serves the tiny converted CustomVoice model with the API key on and
the web console mounted at `/` (so wrong methods meet the static mount). The engine's runaway
budget is cut to one frame per segment, so every speech request, whatever `max_frames` it asks
for, is short. schemathesis runs every phase (examples, coverage, fuzzing, stateful), derandomized,
with a bounded number of examples: every response must be in the document (status, content type,
headers, body, SSE events), no request may get a server error, schema-invalid data must be
refused and schema-valid data accepted. A few dictionaries steer `model`, `voice` and `language`
to served values most of the time, so generated sampling settings reach the engine.

Valid data may also get 400: the schema cannot know which voices, languages and Base models are
served, or when a long input overflows the talker's context; 400 is documented on every route for
exactly that. Everything else about the default check configuration is kept.

schemathesis works in `test-artifacts/openapi-fuzz/` (git-ignored): its config, JUnit report and
the crash files `st replay` reads stay there after a failing run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import pytest

from qwen3_tts_gguf.model.settings import EngineSettings

from api import ModelRegistry, ServerConfig, create_app
from api.testing import ServerThread

pytest.importorskip("schemathesis")

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "test-artifacts" / "openapi-fuzz"
KEY = "fuzz-key"
MAX_EXAMPLES = 100
TIME_LIMIT_S = 150

CONFIG = """\
seed = 20240607
workers = 1
request-timeout = 60

[generation]
deterministic = true
max-examples = {max_examples}
database = "none"

[checks.positive_data_acceptance]
expected-statuses = ["2xx", "400", "401", "404", "409", "429"]

[dictionaries.models]
values = ["tts-1", "gpt-4o-mini-tts", "{model_id}", "no-such-model"]

[dictionaries.voices]
values = ["ryan", "alloy", "vivian", "Serena", "nobody"]

[dictionaries.languages]
values = ["auto", "english", "chinese", "", "klingon"]

[parameters]
"body.model" = {{ dictionary = "models", probability = 0.8 }}
"body.voice" = {{ dictionary = "voices", probability = 0.8 }}
"body.language" = {{ dictionary = "languages", probability = 0.7 }}
"""


@pytest.fixture(scope="module")
def server(tiny_cv_f32, tmp_path_factory):
    registry = ModelRegistry.load([tiny_cv_f32], EngineSettings(
        threads=1, max_streams=4, max_pending=8, budget_base_frames=1, budget_frames_per_token=0))
    console = tmp_path_factory.mktemp("console")
    (console / "index.html").write_text("<h1>console</h1>")
    config = ServerConfig(api_key=KEY, webui_dir=console, voices_dir=tmp_path_factory.mktemp("voices"))
    try:
        with ServerThread(create_app(config, registry)) as running:
            yield running, registry
    finally:
        registry.close()


def _requests_by_status(url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    pattern = re.compile(r'^qtts_http_requests_total\{path="([^"]*)",status="(\d+)"\} (\S+)$', re.M)
    return {(path, status): float(value) for path, status, value in pattern.findall(text)}


def test_schemathesis_finds_nothing(server):
    running, registry = server
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    config = WORK / "schemathesis.toml"
    config.write_text(CONFIG.format(max_examples=MAX_EXAMPLES, model_id=registry.default.id))
    command = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
               f"{running.url}/openapi.json", "--checks", "all", "-H", f"Authorization: Bearer {KEY}",
               "--report", "junit", "--report-dir", str(WORK / "report"), "--no-color"]
    started = time.monotonic()
    result = subprocess.run(command, cwd=WORK, capture_output=True, text=True, timeout=TIME_LIMIT_S)
    output = result.stdout + result.stderr
    (WORK / "output.txt").write_text(output)
    assert result.returncode == 0, output[-12000:]
    assert re.search(r"(\d+) generated, \1 passed", output), output[-6000:]

    counts = _requests_by_status(running.url)
    server_errors = {k: v for k, v in counts.items() if k[1].startswith("5")}
    assert not server_errors, server_errors  # the server's own count agrees: no 5xx at all
    spoken = counts.get(("/v1/audio/speech", "200"), 0)
    assert spoken >= 20, f"only {spoken} speech requests reached the engine: {counts}"
    assert time.monotonic() - started < TIME_LIMIT_S
