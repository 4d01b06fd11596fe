"""The server hands out its own SDKs (`GET /sdk/`), and it, its console and its sockets work behind a path
prefix: `serve --root-path /tts`, or `X-Forwarded-Prefix` from a trusted proxy. (Named test_webui_*: its
browser test takes the session's Playwright, whose event loop stays in the main thread, so it runs after the
tests that start loops of their own, as the console's tests do.)

Real parts throughout: uvicorn on loopback; a reverse proxy in front that strips `/tts`
(`tests/prefix_proxy.py`); `pip install <url>` into a fresh `python -m venv` and the installed client used
against the server; `npm install <url>` and the installed module run by node 20 against the server (its
`.d.ts` type-checked by `tsc` where Debian's node-typescript is installed, else checked against the
module's exports); the console's SDK panel and the browser SDK in Debian's chromium (Playwright).
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from qwen3_tts_gguf import __version__

from api.limits import ServerLimits
from api.ops.forwarded import ForwardedHeaders
from api.sdk import npm, wheel
from api.sdk.downloads import SdkDownloads
from api.testing import ServerThread
from tests.conftest import CHROMIUM
from tests.prefix_proxy import PrefixProxy, proxy_thread
from tests.server_fixtures import registry_fixture, server_fixture
from tests.ws_helpers import httpx, run_async

ROOT = Path(__file__).resolve().parent.parent
WEBUI = ROOT / "webui"
BROWSER_SDK = WEBUI / "browser-sdk"
ARTIFACTS = ROOT / "test-artifacts"
KEY = "sdk-key"
PREFIX = "/tts"
FRAMES = 2
SAMPLES_PER_FRAME = 1920
TIMEOUT = 60
WHEEL = "qtts_client-0.1.0-py3-none-any.whl"
TARBALL = f"qwen3-tts-x-{__version__}.tgz"

registry = registry_fixture(2)
server = server_fixture(api_key=KEY, webui_dir=WEBUI, limits=ServerLimits(trusted_proxies=("127.0.0.1",)))


@pytest.fixture(scope="module")
def rooted(server):
    """The same app on a second listener whose uvicorn has `root_path=/tts` (`serve --root-path /tts`)."""
    with ServerThread(server.app, config=replace(server.config, root_path=PREFIX), lifespan="off") as listener:
        yield listener


@pytest.fixture(scope="module")
def header_proxy(server):
    """/tts/ -> the server, saying `X-Forwarded-Prefix: /tts` (the server trusts 127.0.0.1)."""
    with proxy_thread(PrefixProxy("127.0.0.1", server.port, PREFIX, send_prefix=True)) as thread:
        yield thread


@pytest.fixture(scope="module")
def root_proxy(rooted):
    """/tts/ -> the `--root-path /tts` listener, no prefix header."""
    with proxy_thread(PrefixProxy("127.0.0.1", rooted.port, PREFIX, send_prefix=False)) as thread:
        yield thread


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def speak_on_socket(ws_url: str, **headers: str) -> tuple[dict, int]:
    """One `/v1/ws` utterance of FRAMES frames: (done, audio bytes)."""
    with connect(ws_url, additional_headers={"Authorization": f"Bearer {KEY}", **headers}, proxy=None,
                 open_timeout=TIMEOUT) as ws:
        ws.send(json.dumps({"type": "start", "voice": "ryan", "seed": 1, "max_frames": FRAMES}))
        ws.send(json.dumps({"type": "text", "text": "Hello there."}))
        ws.send(json.dumps({"type": "stop"}))
        audio = 0
        while True:
            message = ws.recv(timeout=TIMEOUT)
            if isinstance(message, bytes):
                audio += len(message)
            elif json.loads(message)["type"] == "done":
                return json.loads(message), audio


# -- the downloads -------------------------------------------------------------------------------------


def test_sdk_lists_the_two_packages_with_checksums_and_serves_exactly_them(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:  # no key: open like the console
        listing = http.get("/sdk/index.json").json()["files"]
        assert [(f["name"], f["kind"], f["installer"]) for f in listing] == [
            (WHEEL, "python", "pip"), (TARBALL, "npm", "npm")]
        page = http.get("/sdk/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        for entry in listing:
            body = http.get(f"/sdk/{entry['url']}")
            assert body.status_code == 200 and len(body.content) == entry["size"]
            assert sha256(body.content) == entry["sha256"] and body.headers["etag"] == f'"{entry["sha256"]}"'
            assert f'href="{entry["name"]}#sha256={entry["sha256"]}"' in page.text  # relative, pip checks the hash
            assert http.head(f"/sdk/{entry['url']}").status_code == 200
        redirect = http.get("/sdk")
        assert redirect.status_code == 308 and redirect.headers["location"] == "sdk/"  # relative: any prefix
        assert re.findall(r'href="([^"]+)"', page.text) == ["index.json"] + [
            f"{e['name']}#sha256={e['sha256']}" for e in listing]  # nothing else, nothing absolute


@pytest.mark.parametrize("path", [
    "/sdk/..%2Fapi%2Fapp.py", "/sdk/%2e%2e%2fapi%2fapp.py", "/sdk/..%5Capi%5Capp.py", "/sdk/qtts_client",
    "/sdk/qtts_client-0.0.1-py3-none-any.whl", "/sdk/" + "x" * 2000, "/sdk/index.js", "/sdk/%00",
])
def test_nothing_else_is_served_under_sdk(server, path):
    host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)  # the raw path, as a client may send it
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    assert response.status == 404, (path, response.status, body[:200])
    assert json.loads(body)["error"]["code"] == "not_found" and b"import" not in body


def test_the_packages_are_the_sources_and_the_same_bytes_every_time():
    first = SdkDownloads(ROOT / "qtts_client", BROWSER_SDK, __version__).files()
    again = SdkDownloads(ROOT / "qtts_client", BROWSER_SDK, __version__).files()
    assert {n: d.data for n, d in first.items()} == {n: d.data for n, d in again.items()}
    with zipfile.ZipFile(io.BytesIO(first[WHEEL].data)) as whl:
        names = whl.namelist()
        assert sorted(n for n in names if n.startswith("qtts_client/")) == sorted(
            f"qtts_client/{p.name}" for p in (ROOT / "qtts_client").glob("*.py"))
        for name in names:
            if name.startswith("qtts_client/"):
                assert whl.read(name) == (ROOT / name).read_bytes()
        record = whl.read("qtts_client-0.1.0.dist-info/RECORD").decode().splitlines()
        assert len(record) == len(names) and record[-1] == "qtts_client-0.1.0.dist-info/RECORD,,"
        for line in record[:-1]:  # every file's hash and size, as pip checks them
            name, digest, size = line.split(",")
            data = whl.read(name)
            assert digest == wheel._record_hash(data) and int(size) == len(data)
        metadata = whl.read("qtts_client-0.1.0.dist-info/METADATA").decode()
        assert "Name: qtts_client\nVersion: 0.1.0\n" in metadata and "Requires-Dist: websockets>=13" in metadata
        assert {info.date_time for info in whl.infolist()} == {wheel.TIMESTAMP}
    with tarfile.open(fileobj=io.BytesIO(first[TARBALL].data)) as tgz:
        members = tgz.getmembers()
        assert {m.mtime for m in members} == {npm.NPM_MTIME} and all(m.name.startswith("package/") for m in members)
        files = {m.name[len("package/"):]: tgz.extractfile(m).read() for m in members}
    package = json.loads(files.pop("package.json"))
    assert package["name"] == "qwen3-tts-x" and package["version"] == __version__ and package["type"] == "module"
    assert package["types"] == "./index.d.ts" and package["exports"]["."]["import"] == "./index.js"
    sources = {p.name: p.read_bytes() for p in BROWSER_SDK.iterdir() if p.suffix in (".js", ".ts")}
    assert files == sources  # the console's own modules, not a copy


# -- behind a path prefix -----------------------------------------------------------------------------


@pytest.mark.parametrize("way", ["header_proxy", "root_proxy"])
def test_sdk_console_and_sockets_work_behind_the_prefix(way, request):
    proxy = request.getfixturevalue(way)
    base = f"{proxy.url}{PREFIX}"
    with httpx.Client(timeout=TIMEOUT) as http:
        listing = http.get(f"{base}/sdk/index.json").json()["files"]
        for entry in listing:
            assert sha256(http.get(f"{base}/sdk/{entry['url']}").content) == entry["sha256"]
        assert 'href="qtts_client-' in http.get(f"{base}/sdk/").text
        console = http.get(f"{base}/")
        assert console.status_code == 200 and 'src="app.js"' in console.text  # relative: under the prefix
        assert http.get(f"{base}/browser-sdk/index.js").content == (BROWSER_SDK / "index.js").read_bytes()
        assert http.get(f"{base}/v1/models").status_code == 401
        models = http.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert models.status_code == 200 and models.json()["data"]
        assert f"{PREFIX}/openapi.json" in http.get(f"{base}/docs").text  # the server knows its prefix
    done, audio = speak_on_socket(f"ws://{urlsplit(proxy.url).netloc}{PREFIX}/v1/ws")
    assert done["finish_reason"] == "max_frames" and audio == FRAMES * SAMPLES_PER_FRAME * 2
    assert "/v1/ws" in proxy.proxy.seen and "/sdk/index.json" in proxy.proxy.seen


def test_the_api_key_holds_under_the_root_path(rooted):
    """uvicorn puts the root path in front of every path: the key, body limits and Host checks still see the
    API paths (a prefix is no way around them)."""
    with httpx.Client(base_url=rooted.url, timeout=TIMEOUT) as http:
        assert http.get("/v1/models").status_code == 401
        assert http.get(f"{PREFIX}/v1/models").status_code == 404  # the prefix is the proxy's: stripped there
        assert http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        big = http.post("/v1/audio/speech", content=b"x" * (2 * 1024 * 1024),
                        headers={"Authorization": f"Bearer {KEY}"})
        assert big.status_code == 413
        assert http.get("/v1/models", headers={"Host": "evil.example"}).status_code == 400


def test_a_forwarded_prefix_counts_only_from_a_trusted_proxy(server):
    async def seen(peer: str, prefix: str | None) -> dict:
        got: dict = {}

        async def app(scope, receive, send):
            got.update(root_path=scope.get("root_path", ""), path=scope["path"], scheme=scope["scheme"])

        headers = [(b"x-forwarded-proto", b"https")] + ([(b"x-forwarded-prefix", prefix.encode())] if prefix else [])
        scope = {"type": "http", "path": "/v1/models", "root_path": "", "scheme": "http", "headers": headers,
                 "client": (peer, 1234), "raw_path": b"/v1/models"}
        await ForwardedHeaders(app, trusted_proxies=("10.0.0.0/8",))(scope, None, None)
        return got

    assert run_async(seen("10.1.2.3", "/a/b/")) == {"root_path": "/a/b", "path": "/a/b/v1/models", "scheme": "https"}
    assert run_async(seen("192.0.2.7", "/a")) == {"root_path": "", "path": "/v1/models", "scheme": "http"}
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:  # 127.0.0.1 is trusted by this server
        for bad in ("/../x", "/a b", "/x%2f", "/" + "a" * 300, "/a,/b"):
            refused = http.get("/sdk/index.json", headers={"X-Forwarded-Prefix": bad})
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_forwarded_prefix"
    with pytest.raises(InvalidStatus) as refused_socket:  # a socket: refused before it opens
        connect(f"ws://{urlsplit(server.url).netloc}/v1/ws", additional_headers={"X-Forwarded-Prefix": "/.."},
                proxy=None, open_timeout=TIMEOUT)
    assert refused_socket.value.response.status_code == 403


# -- pip and npm against the running server ----------------------------------------------------------


def fresh_venv(path: Path) -> Path:
    """A new `python -m venv` with only `websockets` (copied from this environment with its metadata, so pip
    counts the wheel's one dependency as met without an index)."""
    subprocess.run([sys.executable, "-m", "venv", path], check=True, capture_output=True, timeout=TIMEOUT)
    python = path / "bin" / "python"
    purelib = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    import websockets

    package = Path(websockets.__file__).parent
    shutil.copytree(package, purelib / "websockets", ignore=shutil.ignore_patterns("__pycache__"))
    for info in package.parent.glob("websockets-*.dist-info"):
        shutil.copytree(info, purelib / info.name)
    return python


CLIENT_SCRIPT = textwrap.dedent("""
    import json, sys
    import qtts_client
    url, key = sys.argv[1], sys.argv[2]
    with qtts_client.Client(url, api_key=key) as client:
        caps = client.capabilities()
        wav = client.speak("Hello there.", "ryan", seed=1, max_frames=2)
        events = list(client.stream_text(["Hel", "lo ", "there."], voice="ryan", seed=1, max_frames=2))
    print(json.dumps({"file": qtts_client.__file__, "version": qtts_client.__version__, "riff": wav[:4].decode(),
                      "protocols": [p.name for p in caps.protocols], "done": events[-1].finish_reason,
                      "audio": sum(len(e.data) for e in events if isinstance(e, qtts_client.Audio))}))
""")


def test_pip_installs_the_wheel_from_its_url_and_the_client_speaks_behind_the_prefix(header_proxy, tmp_path):
    python = fresh_venv(tmp_path / "venv")
    base = f"{header_proxy.url}{PREFIX}"
    env = {"PATH": os.environ.get("PATH", ""), "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    pip = [python, "-m", "pip", "install", "-q", "--no-index"]
    installed = subprocess.run([*pip, f"{base}/sdk/{WHEEL}"], capture_output=True, text=True, env=env,
                               timeout=TIMEOUT, check=False)  # with its dependency resolved (websockets, already there)
    assert installed.returncode == 0, installed.stderr
    # the listing is a find-links page: pip picks the wheel there and checks its #sha256
    again = subprocess.run([*pip, "--force-reinstall", "--no-deps", "--find-links", f"{base}/sdk/", "qtts_client"],
                           capture_output=True, text=True, env=env, timeout=TIMEOUT, check=False)
    assert again.returncode == 0, again.stderr
    run = subprocess.run([python, "-c", CLIENT_SCRIPT, base, KEY], cwd=tmp_path, capture_output=True, text=True,
                         env=env, timeout=TIMEOUT, check=False)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["file"].startswith(str(tmp_path / "venv")) and result["version"] == "0.1.0"
    assert result["riff"] == "RIFF" and "qtts" in result["protocols"]
    assert result["done"] == "max_frames" and result["audio"] == FRAMES * SAMPLES_PER_FRAME * 2
    assert "/v1/ws" in header_proxy.proxy.seen  # the socket went through the prefix too


NODE_SCRIPT = textwrap.dedent("""
    import * as sdk from 'qwen3-tts-x';
    const [base, key] = process.argv.slice(2);
    const exports = Object.keys(sdk).sort();
    const urls = [sdk.httpUrl('v1/models', base).href, sdk.socketUrl('/v1/ws', base + '/v1/').href];
    const socket = await sdk.QttsSocket.connect({ baseUrl: base, apiKey: key });
    let audio = 0;
    const done = await socket.speak('Hello there.', { voice: 'ryan', seed: 1, max_frames: 2 },
      { onAudio: (bytes) => { audio += bytes.length; } });
    await socket.close();
    const rt = await sdk.RealtimeSocket.connect({ baseUrl: base, apiKey: key });
    await rt.updateSession({ audio: { output: { voice: 'ryan' } }, seed: 1, max_output_tokens: 2 });
    let rtAudio = 0;
    const response = await rt.speak('Hello there.', { onAudio: (bytes) => { rtAudio += bytes.length; } });
    await rt.close();
    let refused = null;
    try { await (await sdk.QttsSocket.connect({ baseUrl: base, apiKey: 'wrong' })).speak('x', {}); }
    catch (e) { refused = { name: e.name, code: e.code }; }
    console.log(JSON.stringify({ exports, urls, done: done.finish_reason, audio, rt: response.response.status,
                                 rtAudio, refused }));
""")

TS_CONSUMER = textwrap.dedent("""
    import { PcmPlayer, QttsSocket, RealtimeSocket, ApiError, httpUrl, type DoneEvent } from 'qwen3-tts-x';
    export async function demo(base: string): Promise<number> {
      const player = new PcmPlayer();
      const socket: QttsSocket = await QttsSocket.connect({ baseUrl: base, apiKey: 'k' });
      const done: DoneEvent = await socket.speak('Hi', { voice: 'ryan', seed: 1 },
        { onAudio: (bytes: Uint8Array) => player.play(bytes) });
      const rt = await RealtimeSocket.connect({ baseUrl: new URL(base), model: 'tts-1' });
      await rt.speak('Hi');
      const url: URL = httpUrl('v1/models', base);
      return done.audio_s + url.href.length + (new ApiError('x').status ?? 0);
    }
""")


def check_types(package: Path, work: Path, runtime_exports: list[str]) -> None:
    """`tsc --strict` on a consumer of the installed package where tsc exists; else every runtime export is
    declared in `index.d.ts` and every declared one exists (and its braces balance)."""
    declarations = (package / "index.d.ts").read_text()
    declared = sorted(set(re.findall(r"^export declare (?:class|function|const) (\w+)", declarations, re.MULTILINE)))
    assert declared == runtime_exports
    assert declarations.count("{") == declarations.count("}") and declarations.count("(") == declarations.count(")")
    tsc = shutil.which("tsc")
    if tsc is None:
        return
    (work / "consumer.ts").write_text(TS_CONSUMER)
    checked = subprocess.run([tsc, "--noEmit", "--strict", "--target", "es2020", "--module", "es2020",
                              "--moduleResolution", "node", "--lib", "es2020,dom", "consumer.ts"],
                             cwd=work, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _node_lacks_websocket() -> str | None:
    """Why node cannot run the check (its WebSocket needs node 20.10 or later), or None."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        return "node and npm are not installed"
    version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip().lstrip("v")
    major, minor = (int(x) for x in version.split(".")[:2])
    return None if (major, minor) >= (20, 10) else f"node {version} has no WebSocket (20.10 or later has)"


@pytest.mark.skipif(_node_lacks_websocket() is not None, reason=str(_node_lacks_websocket()))
def test_npm_installs_the_browser_sdk_from_its_url_and_node_speaks_with_it(header_proxy, tmp_path):
    base = f"{header_proxy.url}{PREFIX}"
    work = tmp_path / "app"
    work.mkdir()
    (work / "package.json").write_text('{"name": "sdk-check", "version": "1.0.0", "private": true}\n')
    env = {**os.environ, "npm_config_cache": str(tmp_path / "npm-cache"), "npm_config_update_notifier": "false"}
    # a registry that cannot answer: the package has no dependency, nothing else is fetched
    installed = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts",
                                "--registry", "http://127.0.0.1:9/", f"{base}/sdk/{TARBALL}"],
                               cwd=work, capture_output=True, text=True, env=env, timeout=TIMEOUT, check=False)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    package = work / "node_modules" / "qwen3-tts-x"
    assert json.loads((package / "package.json").read_text())["version"] == __version__
    (work / "check.mjs").write_text(NODE_SCRIPT)
    run = subprocess.run(["node", "--experimental-websocket", "check.mjs", base, KEY], cwd=work, capture_output=True,
                         text=True, timeout=TIMEOUT, check=False)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["urls"] == [f"{base}/v1/models", f"ws://{urlsplit(base).netloc}{PREFIX}/v1/ws"]
    assert result["done"] == "max_frames" and result["audio"] == FRAMES * SAMPLES_PER_FRAME * 2
    assert result["rt"] == "incomplete" and result["rtAudio"] == FRAMES * SAMPLES_PER_FRAME * 2
    assert result["refused"] == {"name": "ApiError", "code": "invalid_api_key"}
    assert "/v1/realtime" in header_proxy.proxy.seen
    check_types(package, work, result["exports"])


# -- the console's SDK panel and the SDK in a browser, behind the prefix ------------------------------


@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian chromium is not installed")
def test_the_console_shows_this_address_and_the_browser_sdk_speaks_behind_the_prefix(browser, root_proxy):
    pytest.importorskip("playwright.sync_api")
    base = f"{root_proxy.url}{PREFIX}/"
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    page = context.new_page()
    problems: list[str] = []
    sockets: list[str] = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.goto(base)
    page.fill("#api-key", KEY)
    page.press("#api-key", "Enter")
    page.wait_for_function("window.__qtts.ready", timeout=TIMEOUT * 1000)  # the pickers, from v1/ under /tts
    page.click("#sdk > summary")
    page.wait_for_selector("#sdk[data-ready='true']")
    assert page.inner_text("#sdk-pip") == f"pip install {base}sdk/{WHEEL}"
    assert page.inner_text("#sdk-npm") == f"npm install {base}sdk/{TARBALL}"
    assert f'Client("{base}"' in page.inner_text("#sdk-python")
    assert f"baseUrl: '{base}'" in page.inner_text("#sdk-js")
    assert f'base_url="{base}v1"' in page.inner_text("#sdk-openai")
    hashes = page.locator("#sdk-files td.hash").all_inner_texts()
    with httpx.Client(timeout=TIMEOUT) as http:
        listing = http.get(f"{base}sdk/index.json").json()["files"]
    assert hashes == [f["sha256"] for f in listing]
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#sdk").screenshot(path=str(ARTIFACTS / "sdk-panel.png"))
    # the browser SDK as a page uses it: the page's folder is the server, both sockets, WebAudio playback
    result = page.evaluate("""async (key) => {
        const sdk = await import('./browser-sdk/index.js');
        const player = new sdk.PcmPlayer();
        player.ensure();
        const socket = await sdk.QttsSocket.connect({ apiKey: key });
        const done = await socket.speak('Hello there.', { voice: 'ryan', seed: 1, max_frames: 2 },
          { onAudio: (bytes) => player.play(bytes) });
        await socket.close();
        const rt = await sdk.RealtimeSocket.connect({ apiKey: key });
        await rt.updateSession({ audio: { output: { voice: 'ryan' } }, seed: 1, max_output_tokens: 2 });
        const response = await rt.speak('Hello there.', { onAudio: (bytes) => player.play(bytes) });
        await rt.close();
        return { done: done.finish_reason, rt: response.response.status, samples: player.stats.scheduledSamples,
                 heard: player.heard().length, context: player.stats.audioContext.state };
    }""", KEY)
    assert result["done"] == "max_frames" and result["rt"] == "incomplete"
    assert result["samples"] == result["heard"] == 2 * FRAMES * SAMPLES_PER_FRAME
    ws_base = f"ws://{urlsplit(root_proxy.url).netloc}{PREFIX}"
    assert sockets == [f"{ws_base}/v1/ws", f"{ws_base}/v1/realtime"]
    # the console itself speaks under the prefix
    page.select_option("#voice", "ryan")
    page.fill("#max-frames", str(FRAMES))
    page.click("#speak")
    page.wait_for_function("window.__qtts.requests.at(-1)?.finish === 'complete'", timeout=TIMEOUT * 1000)
    assert "/v1/audio/speech" in root_proxy.proxy.seen
    context.close()
    assert not problems, problems
