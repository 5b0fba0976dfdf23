"""What a program's run means: an answer, or the ``BackendError`` that says why there is none.

``answer`` maps an ``Outcome`` through the tool's exit-code map, its ``output`` mode (``text``, ``json``,
``json_array``: parsed, compact, with ``structuredContent``; ``text`` after its ``rewrite`` rules) and its
``thin_when``; ``exit_description`` words a failed run (the exit code or signal, then the tail of stderr, else of
stdout) for errors and probes alike.
"""

from __future__ import annotations

import json
import re
import signal
from typing import Any

import mcp_types as types

from gateway.backends.cli.runs import Outcome
from gateway.config import AdapterTool, ThinWhen
from gateway.errors import BackendError, BackendProtocolError, BackendThinResult

__all__ = ["answer", "clipped", "exit_description"]

_TAIL_LINES = 5
_TAIL_CHARS = 500


def answer(backend: str, spec: AdapterTool, thin: ThinWhen | None, outcome: Outcome) -> types.CallToolResult:
    """The answer of ``outcome`` for ``spec`` run with the rung's ``thin``.

    Raises:
        BackendThinResult: an exit code the map calls thin, or ``thin`` matched the output.
        BackendProtocolError: the output is not what the tool's ``output`` mode promises.
        BackendError: an exit code the map does not know.
    """
    codes = spec.exit_codes
    text = outcome.stdout.decode("utf-8", errors="replace")
    stderr = outcome.stderr.decode("utf-8", errors="replace")
    if outcome.code in codes.thin and outcome.code not in codes.ok:  # "nothing found", in the program's words
        words = _tail(text) or _tail(stderr) or "no output"
        raise BackendThinResult(backend, f"nothing found (exit {outcome.code}): {words}")
    if outcome.code not in codes.ok and outcome.code not in codes.no_result:
        raise BackendError(backend, exit_description(outcome))
    if outcome.code not in codes.ok:  # a no_result code: the program's own words, not an error
        _raise_if_thin(backend, thin, not text.strip(), stderr, text)
        said = types.TextContent(type="text", text=_rewritten(spec, text))
        return types.CallToolResult(content=[said], _meta={"no_result": True})
    if spec.output == "text":
        _raise_if_thin(backend, thin, not text.strip(), stderr, text)
        return types.CallToolResult(content=[types.TextContent(type="text", text=_rewritten(spec, text))])
    if not text.strip():
        _raise_if_thin(backend, thin, True, stderr, text)
        raise BackendProtocolError(backend, f"expected {_mode_noun(spec.output)} on stdout, got no output")
    value = _parse(backend, spec.output, text)
    _raise_if_thin(backend, thin, value in ([], {}, None, ""), stderr, text)
    structured: dict[str, Any] | None = None
    if isinstance(value, list):
        structured = {"results": value}
    elif isinstance(value, dict):
        structured = value
    compact = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return types.CallToolResult(content=[types.TextContent(type="text", text=compact)], structured_content=structured)


def _rewritten(spec: AdapterTool, text: str) -> str:
    """``text`` with the tool's ``rewrite`` rules applied in order (hints in the program's own terms)."""
    for rule in spec.rewrite:
        text = re.sub(rule.pattern, rule.replace, text)
    return text


def exit_description(outcome: Outcome) -> str:
    """How the run ended, in words: ``process exited with code 2: <stderr's tail>``, or killed by a signal."""
    if outcome.code < 0:
        try:
            head = f"process was killed by signal {signal.Signals(-outcome.code).name}"
        except ValueError:
            head = f"process was killed by signal {-outcome.code}"
    else:
        head = f"process exited with code {outcome.code}"
    stderr = _tail(outcome.stderr.decode("utf-8", errors="replace"))
    if stderr:
        return f"{head}: {stderr}"
    stdout = _tail(outcome.stdout.decode("utf-8", errors="replace"))
    return f"{head} (no stderr); stdout: {stdout}" if stdout else f"{head} (no output)"


def clipped(line: str) -> str:
    """``line`` cut to the few hundred characters an error quotes of a program's output."""
    return line if len(line) <= _TAIL_CHARS else line[:_TAIL_CHARS] + "..."


def _parse(backend: str, mode: str, text: str) -> Any:
    if mode == "json_array":
        start, end = text.find("["), text.rfind("]")
        if start < 0 or end < start:
            raise BackendProtocolError(backend, f"expected a JSON array on stdout, found none: {_head(text)}")
        text = text[start : end + 1]
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BackendProtocolError(
            backend, f"expected {_mode_noun(mode)} on stdout: {exc.msg} at char {exc.pos}: {_head(text)}"
        ) from exc


def _raise_if_thin(backend: str, thin: ThinWhen | None, empty: bool, stderr: str, stdout: str) -> None:
    """``thin_when`` conditions are ANDed: ``empty`` (unless switched off), ``stderr_contains`` and
    ``stdout_contains`` (when set). A ``thin_when`` with no condition left never matches."""
    if thin is None:
        return
    conditions: list[bool] = []
    if thin.empty:
        conditions.append(empty)
    if thin.stderr_contains is not None:
        conditions.append(thin.stderr_contains in stderr)
    if thin.stdout_contains is not None:
        conditions.append(thin.stdout_contains in stdout)
    if not conditions or not all(conditions):
        return
    what = "empty result" if thin.empty else "thin result"
    if thin.stdout_contains is not None:
        what = f"{what}: {_tail(stdout)}"
    warning = _tail(stderr)
    raise BackendThinResult(backend, f"{what}; stderr: {warning}" if warning else what)


def _tail(text: str) -> str:
    """The last few non-blank lines, joined with ' | ', at most a few hundred characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    joined = " | ".join(lines[-_TAIL_LINES:])
    return joined if len(joined) <= _TAIL_CHARS else "..." + joined[-_TAIL_CHARS:]


def _head(text: str) -> str:
    text = " ".join(text.split())
    return repr(text[:80] + "..." if len(text) > 80 else text)


def _mode_noun(mode: str) -> str:
    return "a JSON array" if mode == "json_array" else "JSON"
