"""The gateway's version: the installed distribution's (pyproject.toml holds the one version), as clients, downstream
servers, ``/status``, ``/metrics`` and ``gateway --version`` are told it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["DISTRIBUTION", "VERSION"]

DISTRIBUTION = "mcp-federation-gateway"

try:
    VERSION = version(DISTRIBUTION)
except PackageNotFoundError:  # run from a source tree that was never installed (PYTHONPATH=. python -m gateway)
    VERSION = "0+unknown"
