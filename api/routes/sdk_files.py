"""The SDKs this server hands out (`api/sdk/`): GET /sdk/ (an HTML list pip's `--find-links` reads),
/sdk/index.json (the same as JSON), /sdk/<file> (a wheel or an npm tarball, built from this server's own
sources). Open like the console (no key: the code is no secret); out of the OpenAPI document, which
describes the API, not its downloads. Links are relative, so they hold under any path prefix."""

from __future__ import annotations

import asyncio
import base64

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from api.errors import APIError
from api.sdk.downloads import Download, SdkDownloads

router = APIRouter(include_in_schema=False)

MAX_NAME_CHARS = 100
"""Of a refused name, the part the 404 message shows."""


def downloads_of(request: Request) -> SdkDownloads:
    return request.app.state.sdk


async def _files(request: Request) -> dict[str, Download]:
    return await asyncio.to_thread(downloads_of(request).files)  # the first call builds (file reads, zlib)


@router.get("/sdk")
async def sdk_folder() -> RedirectResponse:
    """To the listing (a relative `Location`: right under any prefix)."""
    return RedirectResponse("sdk/", status_code=308)


@router.api_route("/sdk/", methods=["GET", "HEAD"])
async def sdk_listing(request: Request) -> HTMLResponse:
    await _files(request)
    return HTMLResponse(downloads_of(request).listing_html(), headers={"Cache-Control": "no-cache"})


@router.api_route("/sdk/index.json", methods=["GET", "HEAD"])
async def sdk_index(request: Request) -> JSONResponse:
    await _files(request)
    return JSONResponse(downloads_of(request).listing(), headers={"Cache-Control": "no-cache"})


@router.api_route("/sdk/{name}", methods=["GET", "HEAD"])
async def sdk_file(name: str, request: Request) -> Response:
    """One package file, by its exact name; anything else is 404."""
    download = (await _files(request)).get(name)
    if download is None:
        raise APIError(f"No SDK file '{name[:MAX_NAME_CHARS]}' here; GET sdk/ lists them.", status_code=404,
                       code="not_found")
    digest = base64.b64encode(bytes.fromhex(download.sha256)).decode()
    return Response(download.data, media_type=download.media_type, headers={
        "Content-Disposition": f'attachment; filename="{download.name}"', "ETag": f'"{download.sha256}"',
        "Repr-Digest": f"sha-256=:{digest}:", "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})
