"""The app factory: routers, error envelope, middleware, static console, engine lifecycle."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles

from qwen3_tts_gguf import VoiceStore, __version__
from qwen3_tts_gguf.host.cpus import usable_cpus

from api.config import ServerConfig
from api.errors import install_error_handlers
from api.ops import headers, metrics
from api.ops.clients import ClientLimiter
from api.ops.forwarded import ForwardedHeaders
from api.ops.hosts import BrowserGuard
from api.ops.lifecycle import TrackRequests
from api.ops.logs import AccessLog
from api.ops.middleware import PUBLIC_LISTINGS, APIKeyMiddleware, BodyLimits, RequestObserver
from api.protocols import elevenlabs_sockets, native
from api.protocols import realtime as realtime_module
from api.protocols.wyoming import WyomingServer
from api.registry import ModelRegistry
from api.routes import capabilities as capabilities_module
from api.routes import captions, catalog, elevenlabs, probes, sdk_files, speech
from api.routes import voice_profiles as voice_profiles_module
from api.sdk.downloads import SdkDownloads
from api.speaking.warm_up import warm_up
from api.state import AppState
from api.voice_jobs import VoiceJobs
from api.voice_resolution import NoVoiceProfiles, StoredVoiceProfiles, VoiceProfiles

# Feature routers, in order.
ROUTERS: tuple[APIRouter, ...] = (speech.router, captions.router, native.router, catalog.router,
                                  voice_profiles_module.router,
                                  realtime_module.router, elevenlabs_sockets.router, elevenlabs.router,
                                  catalog.elevenlabs_router, probes.router, metrics.router,
                                  capabilities_module.router, sdk_files.router)
ELEVENLABS_ROUTERS = (elevenlabs_sockets.router, elevenlabs.router, catalog.elevenlabs_router)
"""Served again under `elevenlabs_sockets.PREFIX` (ElevenLabs' clients' base URL), with ElevenLabs' model list there
(`catalog.elevenlabs_models`); left out of the OpenAPI document, which describes each route once."""
BROWSER_SDK = "browser-sdk"
"""The browser SDK's folder in the console's (`webui/browser-sdk/`): the console imports it, `/sdk/` packs it."""


def create_app(config: ServerConfig, registry: ModelRegistry, *, voice_profiles: VoiceProfiles | None = None,
               routers: Sequence[APIRouter] = ROUTERS) -> FastAPI:
    """A FastAPI app serving `registry`'s models; its lifespan starts and stops their engines.

    The registry's models stay loaded after the app stops (`registry.close()` frees them).
    The web console (`config.webui_dir`) is mounted at `/` last, so API routes always win.
    `app.state.client_limiter` caps each client's speech streams (`clients.py`);
    `app.state.voice_jobs` runs voice cloning and design (`voice_jobs.py`; made by the lifespan);
    `app.state.wyoming` is the Wyoming listener when `config.wyoming_port` asks for one (`wyoming.py`);
    `app.state.sdk` the SDK downloads (`api/sdk/downloads.py`, served by `routes/sdk_files.py`).
    """
    if voice_profiles is None:  # profiles live in config.voices_dir (none when it is not set)
        voice_profiles = (StoredVoiceProfiles(VoiceStore(config.voices_dir))
                          if config.voices_dir is not None else NoVoiceProfiles())
    state = AppState(config=config, registry=registry, voice_profiles=voice_profiles)
    limits = config.limits
    slots = registry.default.model.settings.max_streams

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.encoder_pool = ThreadPoolExecutor(max_workers=min(8, usable_cpus() + 2),
                                                thread_name_prefix="qtts-encode")
        app.state.voice_jobs = voice_jobs = VoiceJobs(limits.voice_workers, limits.voice_queue)
        registry.start()
        wyoming = None
        try:
            if config.warm_up_voices:
                await warm_up(state, config.warm_up_voices)
            if config.wyoming_port is not None:
                app.state.wyoming = wyoming = WyomingServer(state, app.state)
                await wyoming.start(config.wyoming_host or config.host, config.wyoming_port)
            yield
        finally:
            if wyoming is not None:
                await wyoming.close()
            registry.stop()  # first: a running voice design ends with its engine
            voice_jobs.close()
            state.encoder_pool.shutdown(wait=True)

    app = FastAPI(title="Qwen3-TTS-X", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible streaming text-to-speech with Qwen3-TTS.")
    app.state.qtts = state
    app.state.client_limiter = ClientLimiter(limits.requests_per_client(slots), limits.trusted_proxies)
    browser_sdk = config.webui_dir / BROWSER_SDK if config.webui_dir is not None else None
    app.state.sdk = SdkDownloads(config.client_dir, browser_sdk, __version__)
    install_error_handlers(app)
    for router in routers:
        app.include_router(router)
    prefixed = [router for router in routers if router in ELEVENLABS_ROUTERS]
    for router in prefixed + ([catalog.elevenlabs_models] if prefixed else []):
        app.include_router(router, prefix=elevenlabs_sockets.PREFIX, include_in_schema=False)
    # add_middleware wraps: the last added runs first (a trusted proxy's prefix and scheme, requests in progress
    # for the drain, CORS, request ids/metrics, the access record, Host and Origin, the key, then the body's size
    # and time)
    app.add_middleware(BodyLimits, limits=limits)
    if config.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=config.api_key,
                           open_lists=PUBLIC_LISTINGS if config.public_listings else ())
    app.add_middleware(BrowserGuard, config=config)
    app.add_middleware(AccessLog)
    app.add_middleware(RequestObserver, metrics=state.metrics)
    if config.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["*"],
                           allow_headers=["*"], expose_headers=list(headers.EXPOSED))
    app.add_middleware(TrackRequests)
    app.add_middleware(ForwardedHeaders, trusted_proxies=limits.trusted_proxies)  # first: the path all others see
    if config.webui_dir is not None and config.webui_dir.is_dir():
        app.mount("/", StaticFiles(directory=config.webui_dir, html=True), name="webui")
    return app
