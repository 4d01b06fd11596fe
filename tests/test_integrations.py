"""What the clients of docs/integrations.md need beyond the OpenAI contract, through a real server.

Open WebUI reads the voice and model lists without sending its key: `serve --public-listings` opens
those two GETs (and nothing else) on a keyed server.
"""

from __future__ import annotations

import contextlib

from qwen3_tts_gguf.cli import build_parser

from api import ServerConfig, create_app
from api.testing import ServerThread
from tests.server_fixtures import registry_fixture
from tests.ws_helpers import KEY, httpx

registry = registry_fixture(1)


@contextlib.contextmanager
def keyed_server(registry, public_listings: bool):
    config = ServerConfig(api_key=KEY, webui_dir=None, public_listings=public_listings)
    with ServerThread(create_app(config, registry)) as server:
        yield server


def test_public_listings_open_the_two_lists_open_webui_reads_and_nothing_else(registry):
    with keyed_server(registry, public_listings=True) as server:
        voices = httpx.get(f"{server.url}/v1/audio/voices")
        models = httpx.get(f"{server.url}/v1/audio/models")
        assert voices.status_code == 200 and {"id", "name"} <= set(voices.json()["voices"][0])
        assert models.status_code == 200 and models.json()["models"][0]["id"] == registry.default.id
        for method, path in (("GET", "/v1/models"), ("GET", "/v1/capabilities"), ("POST", "/v1/audio/voices"),
                             ("POST", "/v1/audio/speech"), ("GET", "/v1/audio/voices/../../v1/models")):
            refused = httpx.request(method, f"{server.url}{path}")
            assert refused.status_code == 401, (method, path, refused.text)
    with keyed_server(registry, public_listings=False) as server:
        assert httpx.get(f"{server.url}/v1/audio/voices").status_code == 401
        assert httpx.get(f"{server.url}/v1/audio/voices", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_public_listings_flag_and_environment(monkeypatch):
    assert ServerConfig.from_args(build_parser().parse_args(["serve", "--public-listings"])).public_listings
    assert not ServerConfig.from_args(build_parser().parse_args(["serve"])).public_listings
    monkeypatch.setenv("QTTS_PUBLIC_LISTINGS", "1")
    assert ServerConfig.from_args(build_parser().parse_args(["serve"])).public_listings
