"""The command-line adapter: a local program spawned once per tool call, never through a shell.

An adapter (``adapters:`` in federation.yaml) publishes the tools it declares, schemas untouched. ``call_tool`` runs
one rung of the ladder (``ladder()``): it checks the arguments against the tool's schema and fills its defaults
before anything is spawned, builds the argv (argv.py: no value becomes an option), runs the program (runs.py: no
process outlives the call) and maps the outcome to an answer or a ``BackendError`` (answers.py). One deadline covers
the wait for a concurrency slot and the run, and the error says which ran out. ``run`` reports its first outcome
once the configuration, the folder and the command are found (its tools come from the file: nothing is spawned
before a client may list them), then runs its probes (checks.py), and checks again with backoff while FAILED and
every ``RECHECK_READY_S`` while READY. A call that comes before the first probes have answered waits for them,
bounded; a variant its probe found unable to run raises ``VariantNotReady`` before anything is spawned, so the ladder
moves on at once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from tenacity import AsyncRetrying, retry_if_result

from gateway.backends.backoff import backoff, spread
from gateway.backends.base import BackendBase, BackendState, BackendStatus, ProcessStatistics, ProgressFn
from gateway.backends.cli import checks
from gateway.backends.cli.answers import answer
from gateway.backends.cli.argv import build_argv, unknown_placeholder
from gateway.backends.cli.runs import ChildProcess, Outcome, Runs, Spawner, spawn_process
from gateway.calls import NO_UPSTREAM, Upstream
from gateway.config import Adapter, AdapterTool, ThinWhen, VariantProbe
from gateway.errors import (
    BackendTimeout,
    BackendUnavailable,
    InvalidArguments,
    ToolNotFound,
    VariantNotReady,
    quote,
)
from gateway.inputs import ArgumentValidator, InvalidSchema

__all__ = ["ChildProcess", "CliBackend", "CliStatistics", "Spawner", "build_argv", "spawn_process"]

RECHECK_FIRST_S = 5.0
"""A FAILED adapter is checked again after this long, then twice as long each time up to RECHECK_MAX_S."""
RECHECK_MAX_S = 120.0
RECHECK_READY_S = 60.0
"""A READY adapter is checked again this often (its program may be uninstalled under it)."""


@dataclass(frozen=True, slots=True)
class CliStatistics(ProcessStatistics):
    concurrency: int
    spawned_total: int


@dataclass(frozen=True, slots=True)
class _Rung:
    """What one rung of a call runs: the argv template, its deadline, its ``thin_when``, and the variant's name."""

    template: Sequence[str]
    timeout_s: float
    thin: ThinWhen | None
    variant: str | None


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
        self._limiter = anyio.CapacityLimiter(config.concurrency)
        self._runs = Runs(name, config, spawn, self._spawn_failed)
        self._ran = False
        self._tools = tuple(
            types.Tool(name=tool, description=spec.description or None, input_schema=spec.input_schema)
            for tool, spec in config.tools.items()
        )
        self._unready: dict[tuple[str, str], str] = {}  # (tool, variant) -> why its probe found it cannot run
        self._probed = anyio.Event()  # set once the first check has run the probes (or found none to run)
        self._validators: dict[str, ArgumentValidator] = {}
        self._config_problem: str | None = None
        for tool, spec in config.tools.items():
            try:
                self._validators[tool] = ArgumentValidator(spec.input_schema)
            except InvalidSchema as exc:
                self._config_problem = f"tool {tool!r}: input_schema is {exc}"
                break
            problem = unknown_placeholder(tool, spec)
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
        return self.statistics()

    def statistics(self) -> CliStatistics:
        stats = self._limiter.statistics()
        return CliStatistics(
            live_processes=self._runs.live,
            running_calls=stats.borrowed_tokens,
            waiting_calls=stats.tasks_waiting,
            concurrency=self._config.concurrency,
            spawned_total=self._runs.spawned_total,
        )

    # -- lifetime

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Find the program and report ready/failed/disabled (no process spawned: a client's handshake never waits
        for a probe), then run the probes, then stay alive until cancelled.

        On cancellation (gateway shutdown) every live process group is killed and reaped (bounded) before returning.
        """
        if self._ran:
            raise RuntimeError("CliBackend.run() can only be called once per instance")
        self._ran = True
        try:
            await self.check(probes=False)
            task_status.started()
            if self._status.state is BackendState.DISABLED:
                await anyio.sleep_forever()
            if self._status.state is BackendState.READY:
                await self.check()  # the probes report later: a failed health probe, a variant that cannot run
            await self._supervise()
        finally:
            with anyio.CancelScope(shield=True):
                await self._runs.close()

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

    async def check(self, *, probes: bool = True) -> BackendStatus:
        """Run one health check now (configuration, working directory, command, and unless ``probes`` is False the
        health probe and the variants' probes); update the state.

        An adapter with ``enabled: false`` is DISABLED with the operator's reason and is never probed.
        """
        if not self._config.enabled:
            self._set_state(BackendState.DISABLED, self._disabled_reason(), declared=True)
            self._probed.set()
            return self._status
        problem = self._config_problem or await anyio.to_thread.run_sync(checks.locate_problem, self._config)
        if problem is None and probes and self._config.probe is not None:
            problem = await checks.probe_problem(self._runs.run, self._config.probe)
        try:
            if problem is None and probes:
                self._unready = await checks.unready_variants(self._config, self._runs.run)
                self._enter_ready(tuple((f"{t}[{v}]", reason) for (t, v), reason in self._unready.items()))
            elif problem is None:
                self._enter_ready(self._status.unready)
            else:
                self._set_state(BackendState.FAILED, problem)
        finally:
            if probes or problem is not None:
                self._probed.set()
        return self._status

    async def wait_checked(self) -> None:
        await self._probed.wait()

    def _enter_ready(self, unready: tuple[tuple[str, str], ...]) -> None:
        """Be READY with these variants not ready (logged as they change); nothing happens when that is so already."""
        previous = self._status
        if (previous.state, previous.reason, previous.unready) == (BackendState.READY, None, unready):
            return
        checks.log_variants(self._name, previous.unready, unready)
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

    def _spawn_failed(self, problem: str) -> None:
        # Kept as the last error only: the state is for check() to set.
        self._status = dataclasses.replace(self._status, last_error=problem)

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
        upstream: Upstream = NO_UPSTREAM,
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
        if self._config.probe is not None and not self._probed.is_set():  # the health probe has not answered yet
            with anyio.move_on_after(checks.PROBE_TIMEOUT_S):
                await self._probed.wait()
        self._check_callable()
        args = self._validators[tool].prepare(tool, arguments)
        rung = await self._rung(tool, spec, args, variant)
        argv = build_argv(tool, rung.template, args)
        outcome: Outcome | None = None
        waiting = True
        with anyio.move_on_after(rung.timeout_s):
            async with self._limiter:
                waiting = False
                outcome = await self._runs.run(argv)
        if outcome is None:
            raise self._timed_out(rung, waiting)
        return answer(self._name, spec, rung.thin, outcome)

    async def _rung(self, tool: str, spec: AdapterTool, args: dict[str, Any], variant: str | None) -> _Rung:
        """The rung ``variant`` names (the requested one by default); the switch argument in ``args`` set to it.

        Raises:
            InvalidArguments: an unknown variant, or one asked of a tool without variants.
            VariantNotReady: the last check found the variant cannot run here.
        """
        if spec.switch is None:
            if variant is not None:
                raise InvalidArguments(tool, "", f"the tool has no variants (asked for variant {variant!r})")
            return _Rung(spec.argv or (), spec.timeout_s, spec.thin_when, None)
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
        timeout = selected.timeout_s if "timeout_s" in selected.model_fields_set else spec.timeout_s
        return _Rung(selected.argv, timeout, selected.thin_when, chosen)

    def _timed_out(self, rung: _Rung, waiting: bool) -> BackendTimeout:
        where = f"variant {rung.variant}" if rung.variant is not None else ""
        if waiting:
            busy = f"all {self._config.concurrency} slots busy"
            detail = f"{busy}; {where}" if where else busy
            return BackendTimeout(
                self._name, f"timed out after {rung.timeout_s:g} s waiting for a free slot ({detail})"
            )
        suffix = f" ({where})" if where else ""
        return BackendTimeout(self._name, f"timed out after {rung.timeout_s:g} s{suffix}; process group killed")

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
        if self._runs.closed:
            raise BackendUnavailable(self._name, "the gateway is shutting down")
        if self._config_problem is not None:
            raise BackendUnavailable(self._name, self._config_problem)
        if not self._config.enabled:
            raise BackendUnavailable(self._name, f"disabled: {self._disabled_reason()}")
        if self._status.state is BackendState.FAILED:
            raise BackendUnavailable(self._name, self._status.reason or "failed")

    def _disabled_reason(self) -> str:
        return self._config.disabled_reason or "disabled in the configuration"


def _property_default(schema: Mapping[str, Any], name: str) -> Any:
    properties = schema.get("properties")
    if isinstance(properties, dict):
        sub = properties.get(name)
        if isinstance(sub, dict):
            return sub.get("default")
    return None
