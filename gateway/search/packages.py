"""Where the offline models' files are: registry packages found by name and read from their own folders, never
imported (importing ``wordllama`` pulls in requests and a hub client). Free of numpy, so that counting tokens
(tokens.py) loads no more than the tokenizer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["SemanticUnavailable", "package_folder", "tokenizer_file"]


class SemanticUnavailable(Exception):
    """The embedding model cannot be loaded; ``reason`` says why (shown to callers and in the log)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def package_folder(name: str, carries: str) -> Path:
    """The installed package ``name``'s folder (found, not imported: nothing of it runs).

    Raises:
        SemanticUnavailable: the package is not installed (``carries``: what it would have brought, for the reason).
    """
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        raise SemanticUnavailable(f"the {name} package cannot be found: {exc}") from exc
    if spec is None or spec.origin is None:
        raise SemanticUnavailable(f"the {name} package is not installed (it carries {carries})")
    return Path(spec.origin).parent


def tokenizer_file() -> Path | None:
    """The tokenizer file inside the installed ``wordllama`` package (Llama 2's vocabulary), or None without it."""
    try:
        found = package_folder("wordllama", "the embedding model") / "tokenizers" / "l2_supercat_tokenizer_config.json"
    except SemanticUnavailable:
        return None
    return found if found.is_file() else None
