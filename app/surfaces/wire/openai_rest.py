"""OpenAI REST shapes shared by the Realtime surface (``/v1/realtime/client_secrets``) and the REST audio
surface (``/v1/models``, ``/v1/audio/*``): the model id the server announces, and the error body."""

from __future__ import annotations

from fastapi.responses import JSONResponse

MODEL_ID = "omniduplex"
"""The model ``/v1/models`` lists; any ``model`` a client sends is accepted and served by the pipeline."""


def error_response(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    """An OpenAI-shaped error ``{"error": {message, type, param, code}}`` with HTTP ``status``
    (``invalid_request_error`` below 500, else ``server_error``)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)
