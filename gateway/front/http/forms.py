"""What the gateway's own pages (the status page, ui.py; the connect pages, connect.py) check of a form POST."""

from __future__ import annotations

from urllib.parse import parse_qs

from starlette.requests import Request

__all__ = ["MAX_FORM_BYTES", "read_form", "same_origin"]

MAX_FORM_BYTES = 4096  # a sign-in or revoke form holds a few short fields; a bigger body is not the form


def same_origin(request: Request, allowed_origins: set[str]) -> bool:
    """Whether a POST comes from the gateway's own page: its ``Origin`` names the ``Host`` it was sent to (or an
    origin the operator allowed). A browser always sends ``Origin`` with a form POST, so none at all is refused."""
    origin = request.headers.get("origin", "").lower()
    if not origin or origin == "null":
        return False
    if origin in allowed_origins:
        return True
    return origin.split("://", 1)[-1] == request.headers.get("host", "").lower()


async def read_form(request: Request) -> dict[str, str] | None:
    """The urlencoded form body, read up to ``MAX_FORM_BYTES``; None when it is larger."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    fields = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}
