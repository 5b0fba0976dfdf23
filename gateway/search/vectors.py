"""What the search engine's parts pass between them: unit vectors, and the reason a model cannot be loaded."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["SemanticUnavailable", "Vectors"]

Vectors = npt.NDArray[np.float32]
"""Rows of unit vectors (float32), one per text."""


class SemanticUnavailable(Exception):
    """The embedding model cannot be loaded; ``reason`` says why (shown to callers and in the log)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)
