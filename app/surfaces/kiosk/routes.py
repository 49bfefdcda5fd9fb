"""HTTP routes of the demo kiosk (``app.include_router(router)``, before the static mount).

Routes:
    ``GET /kiosk``              the kiosk page (``web/kiosk.html``; its scripts and styles are siblings
                                of the voice chat page's, served by the static mount).
    ``GET /kiosk/``             redirects to ``/kiosk`` (the page's relative URLs resolve from there).
    ``GET /kiosk/config.json``  :func:`~omniduplex.app.surfaces.kiosk.config.page_config` of the server's
    ``kiosk`` settings.

The settings live on ``app.state.server.cfg.kiosk``
(:class:`~omniduplex.app.surfaces.kiosk.config.KioskConfig`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse

from omniduplex.app.surfaces.kiosk.config import page_config

router = APIRouter(tags=["kiosk"])
NO_CACHE = {"cache-control": "no-cache"}
"""A kiosk runs for days: revalidate the page and its settings on every load."""


@router.get("/kiosk", include_in_schema=False)
async def kiosk_page(request: Request):
    page = request.app.state.server.cfg.web_dir / "kiosk.html"
    if not page.is_file():
        return JSONResponse({"error": f"no kiosk page at {page}"}, 404)
    return FileResponse(page, media_type="text/html", headers=NO_CACHE)


@router.get("/kiosk/", include_in_schema=False)
async def kiosk_slash():
    return RedirectResponse("/kiosk", 308)


@router.get("/kiosk/config.json")
async def kiosk_config(request: Request):
    return JSONResponse(page_config(request.app.state.server.cfg.kiosk), headers=NO_CACHE)
