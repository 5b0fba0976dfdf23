"""Fit the tool search's re-ranker and its "nothing fits" model on the development half of the blind requests
(bench/toolsearch_blind/requests.yaml, ``half: dev``), and print the constants for gateway/search/tools.py.

Two logistic regressions, fitted by gradient descent on standardised features (an L2 penalty keeps them small),
then folded back to raw-feature weights: one over each (request, candidate) pair, labelled by whether the candidate
is one of the request's tools; one over each request (its best hit's log-odds and its best cosine), labelled by
whether no tool fits it. Each dev request is fitted in the whole catalog and in random subsets of its servers
(``SIZES``, ``bench_toolsearch.subset``), so the scores mean the same in a gateway of three servers as in one of
fifty-five. The threshold is the lowest "nothing fits" probability at which those "nothing fits" answers are at
least ``--precision`` right (when none is, the most precise one that says it at least three times); the figures at
other thresholds are printed too. The test half is never read here.

    .venv/bin/python -m bench.toolsearch_fit [--precision 0.9]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.bench_toolsearch import SIZES, blind_requests, load_catalog, subset
from gateway.search import tools as toolsearch
from gateway.search.ranking import load_embedder
from gateway.search.tools import Features, ToolIndex

Floats = npt.NDArray[np.float64]


def logistic(x: Floats, y: Floats, l2: float = 1e-2, steps: int = 4000, rate: float = 0.5) -> tuple[Floats, float]:
    """Weights and bias over the raw columns of ``x`` (fitted on standardised ones)."""
    mu, sd = x.mean(axis=0), x.std(axis=0) + 1e-9
    z = (x - mu) / sd
    w, b = np.zeros(x.shape[1]), 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(z @ w + b)))
        w -= rate * (z.T @ (p - y) / len(y) + l2 * w)
        b -= rate * float((p - y).mean())
    return w / sd, b - float((w * mu / sd).sum())


def pairs(index: ToolIndex, reqs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Features, Floats]]:
    """Per request and catalog (``SIZES``, ``subset``): what the ranker reads of it, and its candidates' labels."""
    out = []
    for req in reqs:
        vector = index.query_vector(req["q"])
        assert vector is not None
        for size in SIZES:
            keep, wanted = subset(index, req, size)
            found = index.features(req["q"], vector, keep)
            labels = np.array([index.docs[i].name in wanted for i in found.candidates], dtype=np.float64)
            out.append(({**req, "tools": sorted(wanted)}, found, labels))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", type=float, default=0.9, help="the dev half's 'nothing fits' precision to reach")
    args = parser.parse_args()
    docs, _ = load_catalog()
    index = ToolIndex.build(docs, load_embedder())
    dev = [r for r in blind_requests() if r["half"] == "dev"]
    data = pairs(index, dev)
    w, b = logistic(np.vstack([d[1].rows for d in data]), np.concatenate([d[2] for d in data]))
    queries, nothing = [], []
    for req, found, _labels in data:
        best = float((found.rows @ w + b).max()) if len(found.rows) else -30.0
        queries.append((best, found.best_cos))
        nothing.append(0.0 if req["tools"] else 1.0)
    q, y = np.array(queries), np.array(nothing)
    qw, qb = logistic(q, y)
    p = 1.0 / (1.0 + np.exp(-(q @ qw + qb)))
    threshold, best = None, (0.0, 0.0)
    for t in sorted(set(np.round(p, 3)), reverse=True):
        said = p >= t
        precision = float(y[said].mean())
        if precision >= args.precision:
            threshold = float(t)
        if said.sum() >= 3 and precision > best[0]:
            best = (precision, float(t))
    if threshold is None:
        print(f"no threshold reaches a precision of {args.precision} on dev; taking the most precise one that says it "
              f"at least 3 times ({best[0]:.2f})")  # fmt: skip
        threshold = best[1]
    for t in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
        said = p >= t
        print(f"  at {t}: said {int(said.sum())}, precision {y[said].mean() if said.any() else 1:.2f}, "
              f"recall {y[said].sum() / y.sum():.2f}")  # fmt: skip
    said = p >= threshold
    print(f"dev: {len(dev)} requests x {len(SIZES)} catalogs, {int(y.sum())} with nothing that fits; "
          f"at {threshold:.3f} 'nothing fits' is said "
          f"{int(said.sum())} times, {int(y[said].sum())} rightly")  # fmt: skip
    print(f"FEATURES = {toolsearch.FEATURES}")
    print(f"FEATURE_WEIGHTS = ({', '.join(f'{v:.4f}' for v in w)})")
    print(f"FEATURE_BIAS = {b:.4f}")
    print(f"NOTHING_WEIGHTS = ({', '.join(f'{v:.4f}' for v in qw)})")
    print(f"NOTHING_BIAS = {qb:.4f}")
    print(f"NOTHING_FITS = {threshold:.3f}")


if __name__ == "__main__":
    main()
