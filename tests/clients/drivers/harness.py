"""What every Python client's driver shares: it runs inside that client's own venv (stdlib only here), reads one
scenario as JSON from argv[1] and prints one JSON report on stdout.

The scenario: ``{"target": {"url", "headers"} | {"command", "args", "env"}, "script": [[tool, arguments], ...],
"timeout": seconds}``. A driver is ``async def exercise(scenario, report)``: it connects as its client does, lists the
tools (``report.tools``), makes each scripted call and appends what the client gives the model (``report.read``). The
report: ``{"version", "connected", "tools", "readings": [{"tool", "text", "error"}], "error", "timed_out",
"seconds"}``, where ``error`` is what the client raised (every exception of a group, and their causes, in one text).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from typing import Any

MARK = "MATRIX-REPORT "


def text_of(content: Any) -> str:
    """The text of MCP content blocks (objects or dicts), one block a line."""
    texts = []
    for block in content or []:
        text = getattr(block, "text", None) if not isinstance(block, dict) else block.get("text")
        texts.append(str(text) if text is not None else str(block))
    return "\n".join(texts)


class Report:
    def __init__(self, package: str, pinned: str | None = None) -> None:
        self.version = pinned or version(package)
        self.connected = False
        self.tools: list[str] | None = None
        self.readings: list[dict[str, Any]] = []

    def read(self, tool: str, text: str, error: bool | None) -> None:
        """What the client gives the model for one call; ``error`` None when it gives no error flag."""
        self.readings.append({"tool": tool, "text": text, "error": error})


def describe(exc: BaseException) -> str:
    """Every message of ``exc``: the leaves of an exception group, each with its causes."""
    seen: list[str] = []
    visited: set[int] = set()  # a chain of causes and contexts may loop

    def walk(error: BaseException | None) -> None:
        while error is not None and id(error) not in visited:
            visited.add(id(error))
            if isinstance(error, BaseExceptionGroup):
                for inner in error.exceptions:
                    walk(inner)
                return
            seen.append(f"{type(error).__name__}: {error}")
            error = error.__cause__ or error.__context__

    walk(exc)
    return "\n".join(dict.fromkeys(seen))


def main(package: str, exercise: Callable[[dict[str, Any], Report], Awaitable[None]]) -> None:
    scenario = json.loads(sys.argv[1])
    report = Report(package, scenario.get("version"))
    error: str | None = None
    timed_out = False
    started = time.monotonic()

    async def run() -> None:
        await asyncio.wait_for(exercise(scenario, report), scenario["timeout"])

    try:
        asyncio.run(run())
    except TimeoutError:
        timed_out, error = True, f"no answer within {scenario['timeout']} s"
    except BaseException as exc:  # what the client raised is the finding
        error = describe(exc)
    document = {
        "version": report.version,
        "connected": report.connected,
        "tools": report.tools,
        "readings": report.readings,
        "error": error,
        "timed_out": timed_out,
        "seconds": round(time.monotonic() - started, 2),
    }
    sys.stdout.write(MARK + json.dumps(document) + "\n")  # clients may print too: the report is the marked line
    sys.stdout.flush()
