"""HTTP routes of the demo kiosk (included before the static mount; its media is the browser surface's
``POST /offer``).

Routes:
    ``GET /kiosk``              the kiosk page (``web/kiosk.html``; its scripts and styles are siblings
                                of the voice chat page's, served by the static mount).
    ``GET /kiosk/``             redirects to ``/kiosk`` (the page's relative URLs resolve from there).
    ``GET /kiosk/config.json``  :func:`~.config.page_config` of the kiosk settings.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse

from omniduplex.app.host.auth import Access
from omniduplex.app.surfaces.kiosk.config import KioskConfig, page_config

NO_CACHE = {"cache-control": "no-cache"}
"""A kiosk runs for days: revalidate the page and its settings on every load."""


ACCESS = (Access("/kiosk/"),)
"""What the edge asks of these routes: the page (``/kiosk``) is open, its settings need a key or token."""


def router(cfg: KioskConfig, web_dir: Path) -> APIRouter:
    """The kiosk's routes for settings ``cfg``, its page under ``web_dir``."""
    r = APIRouter(tags=["kiosk"])

    @r.get("/kiosk", include_in_schema=False)
    async def kiosk_page():
        page = web_dir / "kiosk.html"
        if not page.is_file():
            return JSONResponse({"error": f"no kiosk page at {page}"}, 404)
        return FileResponse(page, media_type="text/html", headers=NO_CACHE)

    @r.get("/kiosk/", include_in_schema=False)
    async def kiosk_slash():
        return RedirectResponse("/kiosk", 308)

    @r.get("/kiosk/config.json")
    async def kiosk_config():
        return JSONResponse(page_config(cfg), headers=NO_CACHE)

    return r
