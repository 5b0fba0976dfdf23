"""What the search engine's parts pass between them: unit vectors, and the reason a model cannot be loaded."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gateway.search.packages import SemanticUnavailable

__all__ = ["SemanticUnavailable", "Vectors"]

Vectors = npt.NDArray[np.float32]
"""Rows of unit vectors (float32), one per text."""
