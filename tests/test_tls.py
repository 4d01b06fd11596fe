"""Direct HTTPS and WSS: `serve --ssl-certfile/--ssl-keyfile` (uvicorn's TLS, also as QTTS_SSL_CERTFILE and
QTTS_SSL_KEYFILE), with a certificate the test signs by a CA of its own (`openssl`), and the clients trusting
that CA: the openai SDK (an httpx client whose `verify` is the CA file), `qtts_client` (`verify=`), and a
`websockets` client with an SSL context on `/v1/ws`. Each also refuses the server without the CA."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
from pathlib import Path

import openai
import pytest
from websockets.sync.client import connect

from qwen3_tts_gguf.cli import build_parser

from api import ServerConfig, create_app
from api.config import ServerConfig as Config
from api.ops.connections import uvicorn_config
from api.server import run_server
from api.testing import ServerThread
from qtts_client import Audio, Client, Done, TransportError
from tests.serve_process import ServeProcess
from tests.server_fixtures import registry_fixture
from tests.ws_helpers import httpx

KEY = "tls-key"
FRAMES = 2
PCM_BYTES = FRAMES * 1920 * 2
TIMEOUT = 60

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command is not installed")

registry = registry_fixture(2)


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    """A CA and a server certificate it signed for 127.0.0.1 and localhost (P-256 keys, two days)."""
    work = tmp_path_factory.mktemp("tls")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=qtts test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=work)
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost", cwd=work)
    (work / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                                  "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                                  "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf", cwd=work)
    openssl("req", *ec, "-keyout", "other.key", "-out", "other.csr", "-subj", "/CN=other", cwd=work)
    return {"ca": work / "ca.pem", "cert": work / "server.pem", "key": work / "server.key",
            "other_key": work / "other.key"}


@pytest.fixture(scope="module")
def server(registry, certs):
    config = ServerConfig(api_key=KEY, webui_dir=None, ssl_certfile=certs["cert"], ssl_keyfile=certs["key"])
    with ServerThread(create_app(config, registry)) as running:
        yield running


def trusting(certs) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs["ca"]))


def test_the_openai_sdk_speaks_over_https_trusting_the_ca_file(server, certs):
    assert server.url.startswith("https://")
    client = openai.OpenAI(base_url=server.api_url, api_key=KEY, max_retries=0,
                           http_client=openai.DefaultHttpxClient(verify=str(certs["ca"])))
    assert "tts-1" in [m.id for m in client.models.list()]
    audio = client.audio.speech.create(model="tts-1", voice="alloy", input="Hello there.", response_format="pcm",
                                       extra_body={"seed": 1, "max_frames": FRAMES})
    assert len(audio.content) == PCM_BYTES
    untrusting = openai.OpenAI(base_url=server.api_url, api_key=KEY, max_retries=0)  # the system's CAs only
    with pytest.raises(openai.APIConnectionError):
        untrusting.models.list()


def test_qtts_client_over_https_and_wss_with_verify(server, certs):
    for verify in (str(certs["ca"]), certs["ca"], trusting(certs)):  # a CA file (str or path) or a context
        with Client(server.url, api_key=KEY, verify=verify) as client:
            assert client.capabilities().supports("qtts")
            wav = client.speak("Hello there.", "ryan", seed=1, max_frames=FRAMES)
            events = list(client.stream_text(["Hel", "lo ", "there."], voice="ryan", seed=1, max_frames=FRAMES))
        assert wav[:4] == b"RIFF" and isinstance(events[-1], Done) and events[-1].finish_reason == "max_frames"
        assert sum(len(e.data) for e in events if isinstance(e, Audio)) == PCM_BYTES  # over wss://
    with Client(server.url, api_key=KEY) as client:  # verify=True: the system's CAs, which do not know this one
        with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
            client.speak("Hello there.", "ryan", max_frames=FRAMES)
        with pytest.raises(TransportError):
            client.stream("ryan")


def test_a_websocket_speaks_over_wss_with_an_ssl_context(server, certs):
    wss = server.url.replace("https://", "wss://") + "/v1/ws"
    with connect(wss, ssl=trusting(certs), additional_headers={"Authorization": f"Bearer {KEY}"},
                 open_timeout=TIMEOUT, proxy=None) as ws:
        ws.send(json.dumps({"type": "start", "voice": "ryan", "seed": 1, "max_frames": FRAMES}))
        ws.send(json.dumps({"type": "text", "text": "Hello there."}))
        ws.send(json.dumps({"type": "stop"}))
        audio, done = 0, None
        while done is None:
            message = ws.recv(timeout=TIMEOUT)
            if isinstance(message, bytes):
                audio += len(message)
            elif json.loads(message)["type"] == "done":
                done = json.loads(message)
    assert done["finish_reason"] == "max_frames" and audio == PCM_BYTES
    with pytest.raises(ssl.SSLCertVerificationError):
        connect(wss, ssl=ssl.create_default_context(), open_timeout=TIMEOUT, proxy=None)
    with pytest.raises(Exception):  # noqa: B017  plain ws:// to the TLS port: no handshake
        connect(wss.replace("wss://", "ws://"), open_timeout=5, proxy=None)


def serve_args(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_serve_flags_and_their_variables_reach_uvicorn(certs, monkeypatch):
    args = serve_args("--ssl-certfile", str(certs["cert"]), "--ssl-keyfile", str(certs["key"]), "--root-path", "tts/")
    config = Config.from_args(args)
    assert (config.ssl_certfile, config.ssl_keyfile, config.root_path, config.scheme) == (
        certs["cert"], certs["key"], "/tts", "https")
    settings = uvicorn_config(object(), config)
    assert (settings.ssl_certfile, settings.ssl_keyfile, settings.root_path, settings.proxy_headers) == (
        str(certs["cert"]), str(certs["key"]), "/tts", False)
    monkeypatch.setenv("QTTS_SSL_CERTFILE", str(certs["cert"]))
    monkeypatch.setenv("QTTS_SSL_KEYFILE", str(certs["key"]))
    monkeypatch.setenv("QTTS_ROOT_PATH", "/a/b")
    from_env = Config.from_args(serve_args())
    assert (from_env.ssl_certfile, from_env.ssl_keyfile, from_env.root_path) == (certs["cert"], certs["key"], "/a/b")
    monkeypatch.setenv("QTTS_ROOT_PATH", "/../x")
    with pytest.raises(SystemExit):
        serve_args()


@pytest.mark.parametrize("flags, says", [
    (("--ssl-keyfile", "{key}"), "--ssl-keyfile needs --ssl-certfile"),
    (("--ssl-certfile", "{cert}", "--ssl-keyfile", "{other_key}"), "--ssl-certfile"),
    (("--ssl-certfile", "{missing}"), "No such file"),
    (("--ssl-certfile", "{ca_key}"), "--ssl-certfile"),
])
def test_serve_refuses_tls_files_it_cannot_use_before_loading_models(certs, capsys, flags, says):
    names = {"key": certs["key"], "cert": certs["cert"], "other_key": certs["other_key"],
             "missing": certs["ca"].parent / "missing.pem", "ca_key": certs["ca"].parent / "ca.key"}
    args = serve_args(*(flag.format(**names) for flag in flags), "--model", "/nonexistent-model")
    assert run_server(args) == 2
    assert says in capsys.readouterr().err


class TlsServe(ServeProcess):
    """`serve` whose port speaks TLS: ready when https /ready answers, trusting `ca`."""

    def __init__(self, *args: str, ca: Path, **kwargs):
        super().__init__(*args, **kwargs)
        self.url = self.url.replace("http://", "https://")
        self.ca = ca

    def ready_status(self) -> int | None:
        try:
            return httpx.get(f"{self.url}/ready", timeout=5, verify=str(self.ca)).status_code
        except httpx.TransportError:
            return None


def test_serve_from_the_environment_speaks_https(tiny_cv_f32, certs, tmp_path):
    env = {"QTTS_SSL_CERTFILE": str(certs["cert"]), "QTTS_SSL_KEYFILE": str(certs["key"]), "QTTS_ROOT_PATH": "/tts",
           "QTTS_MODEL": str(tiny_cv_f32), "QTTS_THREADS": "1", "QTTS_WARM_UP_VOICES": "none",
           "QTTS_VOICES_DIR": str(tmp_path / "voices")}
    with TlsServe(log_path=tmp_path / "server.log", env=env, ca=certs["ca"]) as served, \
            httpx.Client(base_url=served.url, verify=str(certs["ca"]), timeout=TIMEOUT) as http:
        assert http.get("/v1/models").status_code == 200
        assert "/tts/openapi.json" in http.get("/docs").text
        assert http.get("/sdk/index.json").json()["files"]
    assert "OpenAI base_url: https://127.0.0.1:" in served.log()
