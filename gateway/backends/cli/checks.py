"""Whether an adapter's program can serve: is it there, does its probe pass, which variants can run here.

Pure of the adapter's state: each function answers from the configuration and, for probes, a ``run`` of the program
(``Runs.run``), and the adapter decides what the answers make of its status. A probe that fails or times out counts
against what it probes; nothing here raises. When the line that makes a variant not ready advises running the
program (qmd doctor's "Next: run `qmd pull`"), the reason also gives that command as the gateway runs the program
(``as_run_here``: in its ``cwd``, with its ``env``, the program found on its ``PATH``), so that a person who runs it
fills the caches the gateway reads, not their own.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import structlog

from gateway.backends.cli.answers import clipped, exit_description
from gateway.backends.cli.runs import Outcome, environment
from gateway.config import Adapter, VariantProbe
from gateway.errors import BackendError

__all__ = [
    "PROBE_TIMEOUT_S",
    "Run",
    "as_run_here",
    "locate_problem",
    "locate_program",
    "log_variants",
    "probe_problem",
    "unready_variants",
]

log = structlog.get_logger("gateway.backend")

PROBE_TIMEOUT_S = 10.0
"""A health probe (``probe: [--version]``) answers at once or the program is not usable."""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_QUOTED_COMMAND = re.compile(r"`([^`\n]+)`")

Run = Callable[[Sequence[str]], Awaitable[Outcome]]
"""Runs ``[command, *argv]`` to its end (``Runs.run``)."""


def locate_problem(config: Adapter) -> str | None:
    """Why the program cannot be started (its folder or command is missing), or None. Blocking."""
    cwd = config.cwd
    if cwd is not None and not Path(cwd).is_dir():
        return f"working directory not found: {cwd}"
    return None if locate_program(config) is not None else f"command not found: {config.command}"


def locate_program(config: Adapter) -> str | None:
    """The program ``command`` names, found as the adapter runs it (in ``cwd``, on its ``PATH``), or None."""
    command, cwd = config.command, config.cwd
    if os.sep in command:
        candidate = command if os.path.isabs(command) or cwd is None else os.path.join(cwd, command)
        return shutil.which(candidate)
    return shutil.which(command, path=environment(config).get("PATH", os.defpath))


async def probe_problem(run: Run, argv: Sequence[str]) -> str | None:
    """Why the adapter's health probe failed (an error, ``PROBE_TIMEOUT_S`` passed, a non-zero exit), or None."""
    outcome: Outcome | None = None
    try:
        with anyio.move_on_after(PROBE_TIMEOUT_S):
            outcome = await run(argv)
    except BackendError as exc:
        return f"probe {list(argv)} failed: {exc.reason}"
    if outcome is None:
        return f"probe {list(argv)} timed out after {PROBE_TIMEOUT_S:g} s"
    if outcome.code != 0:
        return f"probe {list(argv)} {exit_description(outcome)}"
    return None


async def unready_variants(config: Adapter, run: Run) -> dict[tuple[str, str], str]:
    """The variants found unable to run, as ``(tool, variant) -> reason``; each distinct probe runs once.

    A variant is not ready when a line of its probe's output matches one of its ``unready_when`` patterns (that
    line is the reason), or when the probe fails or times out.
    """
    outputs: dict[tuple[tuple[str, ...], float], tuple[list[str], str | None]] = {}
    unready: dict[tuple[str, str], str] = {}
    for tool, spec in config.tools.items():
        for variant, selected in spec.variants.items():
            probe = selected.probe
            if probe is None:
                continue
            key = (probe.argv, probe.timeout_s)
            if key not in outputs:
                outputs[key] = await _variant_probe(config.command, run, probe)
            lines, failure = outputs[key]
            reason = failure or _unready_line(probe, lines, config)
            if reason is not None:
                unready[(tool, variant)] = reason
    return unready


def log_variants(backend: str, before: Sequence[tuple[str, str]], after: Sequence[tuple[str, str]]) -> None:
    """Log each variant that became not ready (or changed reason) and each that became ready again."""
    was, now = dict(before), dict(after)
    for label, reason in now.items():
        if was.get(label) != reason:
            log.warning("backend.variant_not_ready", backend=backend, variant=label, reason=reason)
    for label in was.keys() - now.keys():
        log.info("backend.variant_ready", backend=backend, variant=label)


async def _variant_probe(command: str, run: Run, probe: VariantProbe) -> tuple[list[str], str | None]:
    """The probe's output lines (stdout then stderr, colour codes removed), and why it failed, if it did."""
    shown = " ".join([command, *probe.argv])
    outcome: Outcome | None = None
    try:
        with anyio.move_on_after(probe.timeout_s):
            outcome = await run(probe.argv)
    except BackendError as exc:
        return [], f"its probe `{shown}` failed: {exc.reason}"
    if outcome is None:
        return [], f"its probe `{shown}` timed out after {probe.timeout_s:g} s"
    text = outcome.stdout.decode("utf-8", errors="replace") + "\n" + outcome.stderr.decode("utf-8", "replace")
    lines = [line.strip() for line in _ANSI.sub("", text).splitlines() if line.strip()]
    if outcome.code != 0:
        return lines, f"its probe `{shown}` {exit_description(outcome)}"
    return lines, None


def _unready_line(probe: VariantProbe, lines: Sequence[str], config: Adapter) -> str | None:
    """The first output line matching one of the probe's ``unready_when`` patterns (clipped), and the commands it
    advises as the gateway runs them; else None."""
    for line in lines:
        if any(re.search(pattern, line) for pattern in probe.unready_when):
            detected = f"detected by `{' '.join([os.path.basename(config.command), *probe.argv])}`"
            advised = as_run_here(line, config)
            here = f"; run it as the gateway does: {', '.join(f'`{c}`' for c in advised)}" if advised else ""
            return f"{clipped(line)} ({detected}{here})"
    return None


def as_run_here(text: str, config: Adapter) -> list[str]:
    """The commands ``text`` advises (in backquotes) that run the adapter's program, each as a shell line that runs
    it as the gateway does: ``cd CWD && VAR=value ... /path/to/program ARGS``. Blocking (looks the program up)."""
    name = os.path.basename(config.command)
    program = locate_program(config) or config.command
    setting = [f"{key}={shlex.quote(value)}" for key, value in config.env.items()]
    found = []
    for advice in _QUOTED_COMMAND.findall(text):
        words = advice.split()
        if words and words[0] in (name, config.command):
            line = " ".join([*setting, shlex.quote(program), *words[1:]])
            found.append(f"cd {shlex.quote(config.cwd)} && {line}" if config.cwd else line)
    return found
