"""The gateway's version, as its package metadata says (one place: pyproject.toml)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["VERSION"]

try:
    VERSION = version("mcp-federation-gateway")
except PackageNotFoundError:  # a tree on sys.path that was never installed
    VERSION = "0+unknown"
