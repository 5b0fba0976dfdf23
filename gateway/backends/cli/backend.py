"""The command-line adapter: a local program spawned once per tool call, never through a shell.

An adapter (``adapters:`` in federation.yaml) publishes the tools it declares, schemas untouched. A call validates
its arguments against the tool's ``input_schema`` before anything is spawned, fills in top-level defaults, expands the
variant's argv template (``build_argv``), spawns ``[command, *argv]`` with an environment allow-list (``env`` plus the
``pass_env`` names), stdin from ``/dev/null``, in a session of its own, reads stdout (capped at ``max_output_bytes``)
and stderr (its last ``max_stderr_bytes`` kept), and maps the exit code and the output to an answer or to a
``BackendError``. ``call_tool`` runs one rung; the router walks ``ladder()``.

Guarantees:
  * nothing the client sends reaches a shell, and a value never turns into an option (see ``build_argv``);
  * a spawned process never outlives its call: on timeout, cancellation of the caller, output overflow and gateway
    shutdown the whole process group is signalled (SIGTERM, a short grace, then SIGKILL; at shutdown SIGKILL at once)
    and the leader is reaped, inside a shielded cancel scope with bounded waits. After a normal exit the group is
    swept with SIGKILL as well, so a grandchild that lingers (a launcher that does not forward signals, like qmd's)
    dies with the call. A descendant that left the group (``setsid``) is signalled through the leader's process
    tree while its parent lives, and once orphaned it is the gateway's (a subreaper): ``processes.sweep()`` after
    the call kills it, as soon as no other call that was running when it started still runs;
  * one deadline per call: the step's timeout (the variant's ``timeout_s`` when it sets one, else the tool's) covers
    the wait for a concurrency slot *and* the run. A caller never waits longer than the timeout it was promised, and
    when every slot is held by hung programs a cheap rung fails fast ("waiting for a free slot") instead of queueing
    behind them; the message says which phase ran out;
  * a variant with a ``probe`` is checked with the adapter (at start, then at every re-check): a line of the probe's
    output matching ``unready_when`` (or a probe that fails) marks it not ready, shown in ``BackendStatus.unready``;
    a call for it raises ``VariantNotReady`` before anything is spawned, so the ladder moves on at once. A call that
    comes before the first check has probed waits for it, at most the probe's timeout;
  * foreign errors (``OSError``, anyio stream errors, JSON errors) leave as ``gateway.errors`` classes.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import DEVNULL, PIPE
from typing import Any, Protocol

import anyio
import anyio.abc
import mcp_types as types
import structlog
from jsonschema import exceptions as jsonschema_exceptions  # type: ignore[import-untyped]
from jsonschema import validators as jsonschema_validators
from tenacity import AsyncRetrying, retry_if_result

from gateway.backends import processes
from gateway.backends.backoff import backoff, spread
from gateway.backends.base import BackendBase, BackendState, BackendStatus, ProcessStatistics, ProgressFn
from gateway.config import Adapter, AdapterTool, ThinWhen, VariantProbe, environ
from gateway.errors import (
    BackendError,
    BackendProtocolError,
    BackendThinResult,
    BackendTimeout,
    BackendUnavailable,
    InvalidArguments,
    ToolNotFound,
    VariantNotReady,
    quote,
)

log = structlog.get_logger("gateway.backend")

__all__ = ["ChildProcess", "CliBackend", "CliStatistics", "Spawner", "build_argv", "spawn_process"]

_TERM_GRACE_S = 0.5
"""After SIGTERM to the group, how long the leader may take to exit before everything gets SIGKILL."""
_REAP_TIMEOUT_S = 2.0
"""How long to wait for a SIGKILLed leader to be reaped; only a process stuck in the kernel takes longer."""
_PROBE_TIMEOUT_S = 10.0
RECHECK_FIRST_S = 5.0
"""A FAILED adapter is checked again after this long, then twice as long each time up to RECHECK_MAX_S."""
RECHECK_MAX_S = 120.0
RECHECK_READY_S = 60.0
"""A health probe (``probe: [--version]``) answers at once or the program is not usable."""
_ERROR_TAIL_LINES = 5
_ERROR_TAIL_CHARS = 500

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*)\}")
_COMPOSED = ("$ref", "allOf", "anyOf", "oneOf", "if", "dependentSchemas")


# --------------------------------------------------------------------------------------------------- argv


def build_argv(tool: str, template: Sequence[str], arguments: Mapping[str, Any]) -> list[str]:
    """Expand an argv template with a call's (validated, defaults filled) arguments.

    Rules, in order:
      1. An element without ``{name}`` placeholders is a literal, passed as is. Braces that do not form
         ``{identifier}`` are literal too.
      2. ``{name}`` is replaced by the argument's value: strings as they are, booleans as ``true``/``false``,
         integers (and integral floats) as digits, other numbers with ``str()``, objects and lists embedded in
         text as compact JSON.
      3. An element that is exactly ``{name}`` with a list value expands to one argv element per item.
      4. An element naming an argument that is absent or None (or, for an exact element, an empty list) is
         dropped. When the element is exactly ``{name}``, the element before it is dropped too if that one is a
         literal option (starts with ``-`` and is not ``--``): ``[-n, "{limit}"]`` vanishes as a pair, so an
         optional argument takes its flag with it.
      5. A value that would begin an argv element with ``-`` is refused unless a literal ``--`` comes earlier in the
         template: the program would read it as an option, so a search query could become ``--help`` or
         ``--index=/elsewhere``. Templates put ``--`` before free-text values (``[search, --json, -n, "{limit}",
         --, "{query}"]``) to let such values through as plain text. This applies after a flag too
         (``-n "{limit}"`` with ``-5``), because parsers disagree on whether that is a value.
      6. A value containing a NUL character is refused: argv cannot carry it.

    Raises:
        InvalidArguments: rule 5 or 6, naming the argument.
    """
    out: list[str] = []
    after_double_dash = False
    previous_was_option = False  # the last element appended came from a literal option such as ``-n``
    for element in template:
        names = _PLACEHOLDER.findall(element)
        if not names:
            out.append(element)
            previous_was_option = element.startswith("-") and element != "--"
            after_double_dash = after_double_dash or element == "--"
            continue
        exact = _PLACEHOLDER.fullmatch(element)
        if exact is not None:
            name = exact.group(1)
            value = arguments.get(name)
            items = value if isinstance(value, list) else ([] if value is None else [value])
            if not items:
                if previous_was_option:
                    out.pop()
                previous_was_option = False
                continue
            for item in items:
                text = _render(tool, name, item)
                _check_leading_dash(tool, name, text, after_double_dash)
                out.append(text)
            previous_was_option = False
            continue
        if any(arguments.get(name) is None for name in names):
            previous_was_option = False
            continue
        out.append(_substitute(tool, element, arguments, after_double_dash))
        previous_was_option = False
    return out


def _substitute(tool: str, element: str, arguments: Mapping[str, Any], after_double_dash: bool) -> str:
    parts: list[str] = []
    position = 0
    for match in _PLACEHOLDER.finditer(element):
        parts.append(element[position : match.start()])
        name = match.group(1)
        text = _render(tool, name, arguments[name])
        if not "".join(parts):  # this value starts the element
            _check_leading_dash(tool, name, text, after_double_dash)
        parts.append(text)
        position = match.end()
    parts.append(element[position:])
    return "".join(parts)


def _render(tool: str, name: str, value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = value
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        text = str(int(value)) if value.is_integer() else str(value)
    else:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if "\x00" in text:
        raise InvalidArguments(tool, name, "contains a NUL character, which a command line cannot carry")
    return text


def _check_leading_dash(tool: str, name: str, text: str, after_double_dash: bool) -> None:
    if text.startswith("-") and not after_double_dash:
        raise InvalidArguments(
            tool,
            name,
            f"the value {_preview(text)} starts with '-', which the program would read as an option "
            "(the adapter's argv template has no '--' before it)",
        )


def _preview(text: str, limit: int = 60) -> str:
    return quote(text, limit)


# --------------------------------------------------------------------------------------------------- spawn seam


class ChildProcess(Protocol):
    """What the adapter needs from a spawned program: the seam unit tests replace with a fake."""

    @property
    def pid(self) -> int: ...

    @property
    def stdout(self) -> anyio.abc.ByteReceiveStream: ...

    @property
    def stderr(self) -> anyio.abc.ByteReceiveStream: ...

    async def wait(self) -> int:
        """Wait for the leader to exit and reap it; its exit code (``-N`` when killed by signal N)."""
        ...

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the process's whole group; silent when the group is gone."""
        ...

    async def aclose(self) -> None:
        """Close the pipes (the leader has been reaped or given up on)."""
        ...


class Spawner(Protocol):
    async def __call__(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None) -> ChildProcess: ...


class _OsProcess:
    def __init__(self, process: anyio.abc.Process) -> None:
        self._process = process
        assert process.stdout is not None and process.stderr is not None
        self._stdout = process.stdout
        self._stderr = process.stderr

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def stdout(self) -> anyio.abc.ByteReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> anyio.abc.ByteReceiveStream:
        return self._stderr

    async def wait(self) -> int:
        return await self._process.wait()

    def signal_group(self, signum: int) -> None:
        # The process was started with start_new_session=True, so its group id is its pid. The kernel keeps that
        # id reserved while any member lives, so this reaches grandchildren even after the leader was reaped.
        # A descendant that left the group (setsid) is still in the leader's tree while its parent lives, so the
        # tree is signalled too; one whose parent is gone was re-parented to the gateway: processes.sweep() ends it.
        members = processes.descendants(self._process.pid) if self._process.returncode is None else []
        try:
            os.killpg(self._process.pid, signum)
        except (ProcessLookupError, PermissionError):  # gone (EPERM: only zombies left, on some systems)
            pass
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    async def aclose(self) -> None:
        await self._process.aclose()


async def spawn_process(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None) -> ChildProcess:
    """Start ``argv`` (a list, never a shell string) in a new session, stdin from /dev/null, stdout/stderr piped
    (``processes.open_process``: it cannot outlive the gateway).

    Raises:
        OSError: the program could not be started (translated by the caller).
    """
    process = await processes.open_process(
        argv, call=True, stdin=DEVNULL, stdout=PIPE, stderr=PIPE, env=dict(env), cwd=cwd
    )
    return _OsProcess(process)


# --------------------------------------------------------------------------------------------------- backend


@dataclass(frozen=True, slots=True)
class CliStatistics:
    live_processes: int
    """Spawned and not yet reaped (calls and probes)."""
    running_calls: int
    """Calls holding a concurrency slot."""
    waiting_calls: int
    """Calls waiting for a slot."""
    concurrency: int
    spawned_total: int


@dataclass(eq=False, slots=True)
class _Run:
    process: ChildProcess
    reaped: anyio.Event = field(default_factory=anyio.Event)
    shutdown: bool = False


@dataclass(frozen=True, slots=True)
class _Outcome:
    code: int
    stdout: bytes
    stderr: bytes


class CliBackend(BackendBase):
    """A command-line program as a backend (kind ``adapter``). See the module docstring for the contract.

    Args:
        name: the adapter's name in federation.yaml.
        config: its validated configuration.
        spawn: how to start a process; the default is ``spawn_process`` (tests inject a fake).
    """

    def __init__(self, name: str, config: Adapter, *, spawn: Spawner = spawn_process) -> None:
        super().__init__(name, "adapter", BackendStatus(state=BackendState.STARTING))
        self._config = config
        self._spawn = spawn
        self._limiter = anyio.CapacityLimiter(config.concurrency)
        self._live: set[_Run] = set()
        self._spawned_total = 0
        self._ran = False
        self._closed = False
        self._tools = tuple(
            types.Tool(name=tool, description=spec.description or None, input_schema=spec.input_schema)
            for tool, spec in config.tools.items()
        )
        self._unready: dict[tuple[str, str], str] = {}  # (tool, variant) -> why its probe found it cannot run
        self._probed = anyio.Event()  # set once the first check has probed the variants
        self._validators: dict[str, Any] = {}
        self._config_problem: str | None = None
        for tool, spec in config.tools.items():
            try:
                self._validators[tool] = _compile_schema(spec.input_schema)
            except jsonschema_exceptions.SchemaError as exc:
                self._config_problem = f"tool {tool!r}: input_schema is not a valid JSON Schema: {exc.message}"
                break
            problem = _check_placeholders(tool, spec)
            if problem is not None:
                self._config_problem = problem
                break

    # -- Backend protocol: identity and state (name, kind, status, subscribe: BackendBase)

    def tools(self) -> Sequence[types.Tool]:
        # Known from configuration whatever the state, so a route keeps publishing this schema while the program
        # is missing; the catalog publishes the tools on their own only while the adapter is ready.
        if self._status.state is BackendState.DISABLED:
            return ()
        return self._tools

    def process_statistics(self) -> ProcessStatistics:
        stats = self.statistics()
        return ProcessStatistics(stats.live_processes, stats.running_calls, stats.waiting_calls)

    def statistics(self) -> CliStatistics:
        stats = self._limiter.statistics()
        return CliStatistics(
            live_processes=len(self._live),
            running_calls=stats.borrowed_tokens,
            waiting_calls=stats.tasks_waiting,
            concurrency=self._config.concurrency,
            spawned_total=self._spawned_total,
        )

    # -- lifetime

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Check the program, report ready/failed/disabled, then stay alive until cancelled.

        On cancellation (gateway shutdown) every live process group is killed and reaped (bounded) before returning.
        """
        if self._ran:
            raise RuntimeError("CliBackend.run() can only be called once per instance")
        self._ran = True
        try:
            await self.check()
            task_status.started()
            if self._status.state is BackendState.DISABLED:
                await anyio.sleep_forever()
            await self._supervise()
        finally:
            self._closed = True
            with anyio.CancelScope(shield=True):
                await self._kill_all()

    async def _supervise(self) -> None:
        """Re-check a FAILED adapter with exponential backoff (spread), so it heals when its program appears;
        a READY one is re-checked every RECHECK_READY_S (its program may be uninstalled under us)."""
        while True:
            if self._status.state is BackendState.DISABLED:
                await anyio.sleep_forever()
            if self._status.state is BackendState.FAILED:
                await self._heal()
            else:
                await anyio.sleep(spread(RECHECK_READY_S))
                await self.check()

    async def _heal(self) -> None:
        """Re-check until a check finds the adapter no longer FAILED: the first wait is RECHECK_FIRST_S, each next one
        twice as long, up to RECHECK_MAX_S. The first attempt is the check that found it FAILED."""
        retrying = AsyncRetrying(
            retry=retry_if_result(lambda status: status.state is BackendState.FAILED),
            wait=backoff(RECHECK_FIRST_S, RECHECK_MAX_S),
            sleep=anyio.sleep,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                status = self._status if attempt.retry_state.attempt_number == 1 else await self.check()
            if attempt.retry_state.outcome is not None and not attempt.retry_state.outcome.failed:
                attempt.retry_state.set_result(status)  # what the retry predicate judges (tenacity's documented way)

    async def check(self) -> BackendStatus:
        """Run one health check now (configuration, working directory, command, optional probe); update the state.

        An adapter with ``enabled: false`` is DISABLED with the operator's reason and is never probed.
        """
        if not self._config.enabled:
            self._set_state(BackendState.DISABLED, self._disabled_reason(), declared=True)
            return self._status
        problem = self._config_problem or await anyio.to_thread.run_sync(self._locate_problem)
        if problem is None and self._config.probe is not None:
            problem = await self._probe(self._config.probe)
        try:
            if problem is None:
                unready = await self._probe_variants()
                previous = self._status
                if (previous.state, previous.reason, previous.unready) == (BackendState.READY, None, unready):
                    return self._status
                self._log_variants(previous.unready, unready)
                self._set_status(
                    BackendStatus(
                        BackendState.READY,
                        None,
                        since=previous.since if previous.state is BackendState.READY else time.time(),
                        last_error=previous.last_error,
                        tool_count=len(self._tools),
                        unready=unready,
                    )
                )
            else:
                self._set_state(BackendState.FAILED, problem)
        finally:
            self._probed.set()
        return self._status

    async def _probe_variants(self) -> tuple[tuple[str, str], ...]:
        """Run each distinct variant probe once; the variants found not ready, as ``("tool[variant]", reason)``.

        A variant is not ready when a line of its probe's output matches one of its ``unready_when`` patterns (that
        line is the reason), or when the probe fails or times out.
        """
        outputs: dict[tuple[tuple[str, ...], float], tuple[list[str], str | None]] = {}
        unready: dict[tuple[str, str], str] = {}
        for tool, spec in self._config.tools.items():
            for variant, selected in spec.variants.items():
                probe = selected.probe
                if probe is None:
                    continue
                key = (probe.argv, probe.timeout_s)
                if key not in outputs:
                    outputs[key] = await self._run_variant_probe(probe)
                lines, failure = outputs[key]
                reason = failure or _unready_line(probe, lines, self._config.command)
                if reason is not None:
                    unready[(tool, variant)] = reason
        self._unready = unready
        return tuple((f"{tool}[{variant}]", reason) for (tool, variant), reason in unready.items())

    async def _run_variant_probe(self, probe: VariantProbe) -> tuple[list[str], str | None]:
        """The probe's output lines (stdout then stderr, colour codes removed), and why it failed, if it did."""
        shown = " ".join([self._config.command, *probe.argv])
        outcome: _Outcome | None = None
        try:
            with anyio.move_on_after(probe.timeout_s):
                outcome = await self._run_process(list(probe.argv), max_output=self._config.max_output_bytes)
        except BackendError as exc:
            return [], f"its probe `{shown}` failed: {exc.reason}"
        if outcome is None:
            return [], f"its probe `{shown}` timed out after {probe.timeout_s:g} s"
        text = outcome.stdout.decode("utf-8", errors="replace") + "\n" + outcome.stderr.decode("utf-8", "replace")
        lines = [line.strip() for line in _ANSI.sub("", text).splitlines() if line.strip()]
        if outcome.code != 0:
            return lines, f"its probe `{shown}` {_exit_description(outcome)}"
        return lines, None

    def _log_variants(self, before: tuple[tuple[str, str], ...], after: tuple[tuple[str, str], ...]) -> None:
        was, now = dict(before), dict(after)
        for label, reason in now.items():
            if was.get(label) != reason:
                log.warning("backend.variant_not_ready", backend=self._name, variant=label, reason=reason)
        for label in was.keys() - now.keys():
            log.info("backend.variant_ready", backend=self._name, variant=label)

    def _locate_problem(self) -> str | None:
        cwd = self._config.cwd
        if cwd is not None and not Path(cwd).is_dir():
            return f"working directory not found: {cwd}"
        command = self._config.command
        if os.sep in command:
            candidate = command if os.path.isabs(command) or cwd is None else os.path.join(cwd, command)
            found = shutil.which(candidate)
        else:
            found = shutil.which(command, path=self._environment().get("PATH", os.defpath))
        return None if found is not None else f"command not found: {command}"

    async def _probe(self, argv: Sequence[str]) -> str | None:
        outcome: _Outcome | None = None
        try:
            with anyio.move_on_after(_PROBE_TIMEOUT_S):
                outcome = await self._run_process(list(argv), max_output=self._config.max_output_bytes)
        except BackendError as exc:
            return f"probe {list(argv)} failed: {exc.reason}"
        if outcome is None:
            return f"probe {list(argv)} timed out after {_PROBE_TIMEOUT_S:g} s"
        if outcome.code != 0:
            return f"probe {list(argv)} {_exit_description(outcome)}"
        return None

    async def _kill_all(self) -> None:
        runs = list(self._live)
        for run in runs:
            run.shutdown = True
            run.process.signal_group(signal.SIGKILL)
        with anyio.move_on_after(_REAP_TIMEOUT_S):
            for run in runs:
                await run.reaped.wait()

    # -- calls

    def ladder(self, tool: str, arguments: Mapping[str, Any]) -> Sequence[str | None]:
        """The requested variant (the switch argument, else its schema default, else the first variant), then each
        cheaper rung the tool's ``ladder`` names; ``(None,)`` for a tool without a switch.

        Raises:
            ToolNotFound: the adapter has no such tool.
        """
        spec = self._spec(tool)
        if spec.switch is None:
            return (None,)
        requested = arguments.get(spec.switch)
        if requested is None:
            requested = _property_default(spec.input_schema, spec.switch)
        steps = [str(requested) if requested is not None else next(iter(spec.variants))]
        while (cheaper := spec.ladder.get(steps[-1])) is not None:
            steps.append(cheaper)
        return tuple(steps)

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        variant: str | None = None,
        progress: ProgressFn | None = None,
    ) -> types.CallToolResult:
        """Run one rung of a tool: validate, spawn, read, map.

        Args:
            tool: the tool's own name.
            arguments: the client's arguments (not modified).
            variant: the rung to run; by default the requested one (``ladder(...)[0]``). A ``{switch}`` placeholder
                in the template is given the variant that runs.
            progress: unused (a command-line program reports no progress).

        Raises:
            ToolNotFound: no such tool.
            InvalidArguments: the arguments fail the schema or the argv rules (nothing was spawned).
            BackendUnavailable: disabled, failed, shutting down, or the program could not be started.
            BackendTimeout: no answer within the step's timeout (the process group was killed).
            BackendThinResult: the variant's ``thin_when`` matched the answer.
            BackendProtocolError: the output is not what the tool's ``output`` mode promises.
            BackendError: a non-zero exit outside the exit-code map, or output over the cap.
        """
        del progress
        spec = self._spec(tool)
        self._check_callable()
        args = self._validated(tool, spec, arguments)
        if spec.switch is None:
            if variant is not None:
                raise InvalidArguments(tool, "", f"the tool has no variants (asked for variant {variant!r})")
            template, timeout, thin = spec.argv or (), spec.timeout_s, spec.thin_when
        else:
            chosen = variant if variant is not None else self.ladder(tool, args)[0]
            assert chosen is not None
            selected = spec.variants.get(chosen)
            if selected is None:
                expected = ", ".join(repr(v) for v in spec.variants)
                raise InvalidArguments(
                    tool, spec.switch, f"unknown variant {quote(str(chosen))}; expected one of {expected}"
                )
            if selected.probe is not None:
                await self._check_variant(tool, chosen, selected.probe)
            args[spec.switch] = chosen
            template, thin = selected.argv, selected.thin_when
            timeout = selected.timeout_s if "timeout_s" in selected.model_fields_set else spec.timeout_s
            variant = chosen
        argv = build_argv(tool, template, args)

        outcome: _Outcome | None = None
        waiting = True
        with anyio.move_on_after(timeout):
            async with self._limiter:
                waiting = False
                outcome = await self._run_process(argv, max_output=self._config.max_output_bytes)
        if outcome is None:
            where = f"variant {variant}" if variant is not None else ""
            if waiting:
                busy = f"all {self._config.concurrency} slots busy"
                detail = f"{busy}; {where}" if where else busy
                raise BackendTimeout(self._name, f"timed out after {timeout:g} s waiting for a free slot ({detail})")
            suffix = f" ({where})" if where else ""
            raise BackendTimeout(self._name, f"timed out after {timeout:g} s{suffix}; process group killed")
        return self._answer(spec, thin, outcome)

    async def _check_variant(self, tool: str, variant: str, probe: VariantProbe) -> None:
        """Raise ``VariantNotReady`` (at once, nothing spawned) when the last check found the variant cannot run.

        Before the first check has probed, wait for it (at most the probe's timeout)."""
        if not self._probed.is_set():
            with anyio.move_on_after(probe.timeout_s):
                await self._probed.wait()
        reason = self._unready.get((tool, variant))
        if reason is not None:
            raise VariantNotReady(self._name, f"variant {variant} is not ready: {reason}")

    def _spec(self, tool: str) -> AdapterTool:
        spec = self._config.tools.get(tool)
        if spec is None:
            raise ToolNotFound(tool)
        return spec

    def _check_callable(self) -> None:
        if self._closed:
            raise BackendUnavailable(self._name, "the gateway is shutting down")
        if self._config_problem is not None:
            raise BackendUnavailable(self._name, self._config_problem)
        if not self._config.enabled:
            raise BackendUnavailable(self._name, f"disabled: {self._disabled_reason()}")
        state = self._status.state
        if state is BackendState.FAILED:
            raise BackendUnavailable(self._name, self._status.reason or "failed")

    def _disabled_reason(self) -> str:
        return self._config.disabled_reason or "disabled in the configuration"

    def _validated(self, tool: str, spec: AdapterTool, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validate against the schema as given, then fill top-level ``properties.*.default`` for absent keys."""
        errors = list(self._validators[tool].iter_errors(arguments))
        error = jsonschema_exceptions.best_match(errors)
        if error is not None:
            path, message = _describe_schema_error(error)
            misspelt = _misspelt_argument(error, errors)
            if misspelt is not None:
                path, message = misspelt
            raise InvalidArguments(tool, path, message)
        args = dict(arguments)
        properties = spec.input_schema.get("properties")
        if isinstance(properties, dict):
            for key, sub in properties.items():
                if key not in args and isinstance(sub, dict) and "default" in sub:
                    args[key] = copy.deepcopy(sub["default"])
        return args

    def _environment(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for name in self._config.pass_env:
            value = environ(name)
            if value is not None:
                env[name] = value
        env.update(self._config.env)
        return env

    # -- one process

    async def _run_process(self, argv: list[str], *, max_output: int) -> _Outcome:
        """Spawn ``[command, *argv]``, read it to the end, reap it. Cancelling this kills the process group."""
        command = [self._config.command, *argv]
        with anyio.CancelScope(shield=True):
            # Shielded: a cancellation landing inside the spawn could leave a started process that nobody owns.
            process = await self._start(command)
        # No await between the spawn and the try block below, which owns the process from here on.
        run = _Run(process)
        self._live.add(run)
        self._spawned_total += 1
        if self._closed:  # shutdown began while the spawn was in flight
            run.shutdown = True
            process.signal_group(signal.SIGKILL)
        exited = False
        try:
            stdout, stderr, overflow = await self._communicate(process, max_output)
            if overflow:
                raise BackendError(self._name, f"output exceeded {max_output} bytes; process group killed")
            code = await process.wait()
            exited = True
        finally:
            with anyio.CancelScope(shield=True):
                await self._stop(process, exited=exited)
            self._live.discard(run)
            run.reaped.set()
        if run.shutdown:
            raise BackendUnavailable(self._name, "the gateway is shutting down; process group killed")
        return _Outcome(code, stdout, stderr)

    async def _start(self, command: list[str]) -> ChildProcess:
        """Spawn, translating OSError. A failed spawn is kept as ``last_error``; the state is for ``check()`` to set."""
        cwd = self._config.cwd
        try:
            return await self._spawn(command, env=self._environment(), cwd=cwd)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) and cwd is not None and exc.filename == cwd:
                problem = f"working directory not found: {cwd}"
            elif isinstance(exc, FileNotFoundError):
                problem = f"command not found: {command[0]}"
            elif isinstance(exc, PermissionError):
                problem = f"permission denied: {command[0]}"
            else:
                problem = f"cannot start {command[0]}: {exc.strerror or exc}"
            self._status = dataclasses.replace(self._status, last_error=problem)
            raise BackendUnavailable(self._name, problem) from exc

    async def _communicate(self, process: ChildProcess, max_output: int) -> tuple[bytes, bytes, bool]:
        """Read stdout (to the cap) and stderr (its tail) to their ends; True when stdout went over the cap."""
        stdout = bytearray()
        stderr = bytearray()
        stderr_cap = self._config.max_stderr_bytes
        overflow = False
        failures: list[BaseException] = []

        async def drain_stderr() -> None:
            try:
                async for chunk in process.stderr:
                    stderr.extend(chunk)
                    if len(stderr) > stderr_cap:
                        del stderr[: len(stderr) - stderr_cap]
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                failures.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain_stderr)
            try:
                async for chunk in process.stdout:
                    if len(stdout) + len(chunk) > max_output:
                        overflow = True
                        tg.cancel_scope.cancel()
                        break
                    stdout.extend(chunk)
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                failures.append(exc)
                tg.cancel_scope.cancel()
        if failures:
            raise BackendError(self._name, f"reading the program's output failed: {failures[0]!r}")
        return bytes(stdout), bytes(stderr), overflow

    async def _stop(self, process: ChildProcess, *, exited: bool) -> None:
        """Leave no member of the process group alive. Runs shielded; every wait is bounded."""
        if not exited:
            process.signal_group(signal.SIGTERM)
            with anyio.move_on_after(_TERM_GRACE_S):
                await process.wait()
        # Also after a normal exit: a grandchild may outlive the leader (pid reuse cannot hit us here: the group
        # id stays reserved while any member lives, and a new process never starts as leader of an old group).
        process.signal_group(signal.SIGKILL)
        with anyio.move_on_after(_REAP_TIMEOUT_S):
            await process.wait()
            await process.aclose()
        # A descendant that left the group and outlived the leader was re-parented to the gateway: end it too.
        await processes.sweep()

    # -- the answer

    def _answer(self, spec: AdapterTool, thin: ThinWhen | None, outcome: _Outcome) -> types.CallToolResult:
        codes = spec.exit_codes
        text = outcome.stdout.decode("utf-8", errors="replace")
        stderr = outcome.stderr.decode("utf-8", errors="replace")
        if outcome.code in codes.thin and outcome.code not in codes.ok:  # "nothing found", in the program's words
            words = _tail(text) or _tail(stderr) or "no output"
            raise BackendThinResult(self._name, f"nothing found (exit {outcome.code}): {words}")
        if outcome.code not in codes.ok and outcome.code not in codes.no_result:
            raise BackendError(self._name, _exit_description(outcome))
        if outcome.code not in codes.ok:  # a no_result code: the program's own words, not an error
            self._raise_if_thin(thin, not text.strip(), stderr, text)
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)], _meta={"no_result": True})
        if spec.output == "text":
            self._raise_if_thin(thin, not text.strip(), stderr, text)
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)])
        if not text.strip():
            self._raise_if_thin(thin, True, stderr, text)
            raise BackendProtocolError(self._name, f"expected {_mode_noun(spec.output)} on stdout, got no output")
        value = self._parse(spec.output, text)
        self._raise_if_thin(thin, value in ([], {}, None, ""), stderr, text)
        structured: dict[str, Any] | None = None
        if isinstance(value, list):
            structured = {"results": value}
        elif isinstance(value, dict):
            structured = value
        compact = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=compact)], structured_content=structured
        )

    def _parse(self, mode: str, text: str) -> Any:
        if mode == "json_array":
            start, end = text.find("["), text.rfind("]")
            if start < 0 or end < start:
                raise BackendProtocolError(self._name, f"expected a JSON array on stdout, found none: {_head(text)}")
            text = text[start : end + 1]
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise BackendProtocolError(
                self._name, f"expected {_mode_noun(mode)} on stdout: {exc.msg} at char {exc.pos}: {_head(text)}"
            ) from exc

    def _raise_if_thin(self, thin: ThinWhen | None, empty: bool, stderr: str, stdout: str = "") -> None:
        """``thin_when`` conditions are ANDed: ``empty`` (unless switched off), ``stderr_contains`` and
        ``stdout_contains`` (when set).

        A ``thin_when`` with no condition left never matches.
        """
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
        raise BackendThinResult(self._name, f"{what}; stderr: {warning}" if warning else what)


# --------------------------------------------------------------------------------------------------- helpers


def _compile_schema(schema: Mapping[str, Any]) -> Any:
    cls = jsonschema_validators.validator_for(schema, default=jsonschema_validators.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def _check_placeholders(tool: str, spec: AdapterTool) -> str | None:
    """A placeholder must name a declared property (checked when the schema lists them plainly)."""
    schema = spec.input_schema
    properties = schema.get("properties")
    if not isinstance(properties, dict) or any(key in schema for key in _COMPOSED):
        return None
    templates = [spec.argv or ()] + [v.argv for v in spec.variants.values()]
    for template in templates:
        for element in template:
            for name in _PLACEHOLDER.findall(element):
                if name not in properties:
                    return f"tool {tool!r}: argv names {{{name}}}, which is not a property of its input_schema"
    return None


def _property_default(schema: Mapping[str, Any], name: str) -> Any:
    properties = schema.get("properties")
    if isinstance(properties, dict):
        sub = properties.get(name)
        if isinstance(sub, dict):
            return sub.get("default")
    return None


def _describe_schema_error(error: Any) -> tuple[str, str]:
    """(dotted argument path, message) for a jsonschema ValidationError; names the missing/unexpected key."""
    path = [str(part) for part in error.absolute_path]
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        missing = [key for key in error.validator_value if key not in instance]
        if missing:
            path.append(str(missing[0]))
    elif error.validator == "additionalProperties" and isinstance(instance, dict):
        declared = error.schema.get("properties", {})
        patterns = error.schema.get("patternProperties", {})
        extra = [k for k in instance if k not in declared and not any(re.search(p, k) for p in patterns)]
        if extra:
            path.append(str(extra[0]))
    message = str(error.message)
    if isinstance(instance, str | int | float | None) and message.startswith(repr(instance)):
        # jsonschema quotes the value with Python's repr (None, True, 'x'): say it as the client wrote it, in JSON
        message = json.dumps(instance, ensure_ascii=False) + message[len(repr(instance)) :]
    if len(message) > _ERROR_TAIL_CHARS:
        message = message[:_ERROR_TAIL_CHARS] + "..."
    return ".".join(path), message


def _misspelt_argument(error: Any, errors: list[Any]) -> tuple[str, str] | None:
    """For a missing required argument sent misspelt (``qery`` for ``query``): that argument's path and message."""
    if error.validator != "required" or not isinstance(error.instance, dict):
        return None
    missing = [key for key in error.validator_value if key not in error.instance]
    for other in errors:
        if other.validator != "additionalProperties" or list(other.absolute_path) != list(error.absolute_path):
            continue
        declared = other.schema.get("properties", {})
        patterns = other.schema.get("patternProperties", {})
        extra = [k for k in other.instance if k not in declared and not any(re.search(p, k) for p in patterns)]
        for wanted in missing:
            close = difflib.get_close_matches(wanted, extra, n=1, cutoff=0.75)
            if close:
                path = ".".join([*(str(part) for part in error.absolute_path), close[0]])
                return (
                    path,
                    f"Additional properties are not allowed ({close[0]!r} was unexpected); did you mean {wanted!r}?",
                )
    return None


def _exit_description(outcome: _Outcome) -> str:
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


def _unready_line(probe: VariantProbe, lines: Sequence[str], command: str) -> str | None:
    """The first output line matching one of the probe's ``unready_when`` patterns (clipped), else None."""
    for line in lines:
        if any(re.search(pattern, line) for pattern in probe.unready_when):
            clipped = line if len(line) <= _ERROR_TAIL_CHARS else line[:_ERROR_TAIL_CHARS] + "..."
            return f"{clipped} (detected by `{' '.join([os.path.basename(command), *probe.argv])}`)"
    return None


def _tail(text: str) -> str:
    """The last few non-blank lines, joined with ' | ', at most a few hundred characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    joined = " | ".join(lines[-_ERROR_TAIL_LINES:])
    return joined if len(joined) <= _ERROR_TAIL_CHARS else "..." + joined[-_ERROR_TAIL_CHARS:]


def _head(text: str) -> str:
    text = " ".join(text.split())
    return repr(text[:80] + "..." if len(text) > 80 else text)


def _mode_noun(mode: str) -> str:
    return "a JSON array" if mode == "json_array" else "JSON"
