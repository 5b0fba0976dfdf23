"""The built-in wiki provider: read-only tools over a folder of markdown pages, served in process.

``WikiBackend`` owns the lifecycle of the index of its root (index.py). ``run`` installs a file watcher *first* and
builds the index *second*, so no change slips between the two; each later change marks the index dirty and rebuilds
it in the background, and a call that finds it dirty waits for (or runs) the rebuild, so it never sees a stale or
half-built index. The semantic tools are served from a second snapshot (semantic.py) that follows the first once the
wiki is READY; while its model loads, or for good when it cannot, a semantic call is a ``BackendThinResult`` naming
the reason (so the wiki's breaker stays closed). Bad arguments raise ``InvalidArguments``; ``OSError`` never escapes
(``map_wiki_errors``); the tools themselves are tools.py.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

import anyio
import anyio.from_thread
import anyio.lowlevel
import mcp_types as types
import structlog
import watchfiles
from anyio.abc import TaskStatus
from tenacity import wait_fixed

from gateway.backends.backoff import supervise
from gateway.backends.base import BackendBase, BackendState, BackendStatus, ProgressFn
from gateway.backends.wiki.handlers import estimate_tokens
from gateway.backends.wiki.index import EXCLUDED_DIRS, _build_index, _Index, _is_page_name
from gateway.backends.wiki.semantic import Embedder, SemanticIndex, SemanticUnavailable, build_semantic, load_embedder
from gateway.backends.wiki.tools import WikiTool, tool_specs
from gateway.calls import NO_UPSTREAM, Upstream
from gateway.config import WIKI_TOOLS
from gateway.errors import BackendThinResult, BackendUnavailable, ToolNotFound

__all__ = ["TOOL_NAMES", "WikiBackend", "WikiStatistics", "map_wiki_errors"]

log = structlog.get_logger("gateway.backend")

TOOL_NAMES = WIKI_TOOLS
"""Every tool the wiki can expose, in the order they are listed."""
_WATCH_DEBOUNCE_MS = 1_600  # longest a burst of edits is grouped before the index is rebuilt
_WATCH_STEP_MS = 50  # quiet time that ends a burst; also how fast cancellation stops the watcher thread
_WATCH_POLL_DELAY_MS = 1_000  # only when native watching is unavailable (e.g. the inotify limit) and we poll
_ROOT_RETRY_S = 5.0  # how often a missing root, or a watcher that could not start, is retried


@contextmanager
def map_wiki_errors(backend_name: str) -> Iterator[None]:
    """Translate ``OSError`` raised while indexing or reading the wiki into ``BackendUnavailable``."""
    try:
        yield
    except OSError as exc:
        raise BackendUnavailable(backend_name, f"wiki I/O failed: {exc.strerror or type(exc).__name__}") from exc


@dataclass(frozen=True, slots=True)
class WikiStatistics:
    """Introspection for tests, ``/status`` and benchmarks.

    ``generation`` counts index builds (1 after startup; it grows only when files change); ``dirty`` is True while a
    change has been seen but not indexed yet; ``watching`` is False when changes are not watched (each call rebuilds).
    """

    generation: int
    pages: int
    bytes: int
    dirty: bool
    watching: bool
    last_build_s: float
    semantic: str = "off"
    """``off`` (no semantic tool configured), ``loading``, ``ready`` or ``disabled: <reason>``."""
    semantic_sections: int = 0
    semantic_generation: int = 0
    """The keyword index generation the semantic index was last built from (it follows ``generation``)."""
    semantic_build_s: float = 0.0
    model_load_s: float = 0.0


# --------------------------------------------------------------------------------------------------- the backend


class WikiBackend(BackendBase):
    """The built-in wiki provider (kind ``wiki``). See the module docstring for what it guarantees.

    Args:
        name: the backend's name in federation.yaml.
        root: the folder of markdown pages (it may not exist yet: the backend is then FAILED until it appears).
        tools: which of ``TOOL_NAMES`` to expose (None = all).
        read_all_max_bytes: default cap of ``wiki_read_all``.
        default_max_bytes: default cap of ``files_read`` and ``files_neighbors``.
        load_model: loads the embedding model of the semantic tools (blocking; run in a worker thread after the
            wiki is READY); raises ``SemanticUnavailable`` with the reason it cannot.

    Raises:
        ValueError: an unknown tool name, or a cap below 1.
    """

    def __init__(
        self,
        name: str,
        root: Path,
        tools: Sequence[str] | None = None,
        *,
        read_all_max_bytes: int = 1_000_000,
        default_max_bytes: int = 50_000,
        load_model: Callable[[], Embedder] = load_embedder,
    ) -> None:
        unknown = sorted(set(tools or ()) - set(TOOL_NAMES))
        if unknown:
            raise ValueError(f"Unknown wiki tool(s) {', '.join(unknown)}; choose from {', '.join(TOOL_NAMES)}.")
        if read_all_max_bytes < 1 or default_max_bytes < 1:
            raise ValueError("read_all_max_bytes and default_max_bytes must be at least 1.")
        super().__init__(name, "wiki", BackendStatus(BackendState.STARTING, "indexing the wiki"))
        self._root = Path(root)
        self._root_real = self._root.resolve()
        self._read_all_max_bytes = read_all_max_bytes
        wanted = TOOL_NAMES if tools is None else tuple(t for t in TOOL_NAMES if t in tools)
        specs = tool_specs(default_max_bytes, read_all_max_bytes, self._semantic_view)
        self._tools: dict[str, WikiTool] = {n: specs[n] for n in wanted}
        self._ran = False
        self._index: _Index | None = None
        self._build_lock = anyio.Lock()
        self._changes = 0  # change batches seen (or, when not watching, calls made)
        self._changed_paths: set[str] = set()  # reported by the watcher since the last build
        self._indexed_changes = -1  # value of _changes the current index was built after
        self._watching = False
        self._generation = 0
        self._generation_changed = anyio.Event()
        self._last_build_s = 0.0
        self._semantic_wanted = any(spec.semantic for spec in self._tools.values())
        self._semantic_state = "loading" if self._semantic_wanted else "off"
        self._semantic_reason = ""
        self._embedder: Embedder | None = None
        self._semantic: SemanticIndex | None = None
        self._semantic_generation = 0
        self._semantic_lock = anyio.Lock()
        self._semantic_changed = anyio.Event()
        self._load_model = load_model

    # ------------------------------------------------------------------ Backend protocol (the rest: BackendBase)

    def tools(self) -> Sequence[types.Tool]:
        if self._status.state not in (BackendState.READY, BackendState.DEGRADED):
            return ()
        return tuple(spec.tool for spec in self._tools.values())

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        variant: str | None = None,
        progress: ProgressFn | None = None,
        upstream: Upstream = NO_UPSTREAM,
    ) -> types.CallToolResult:
        """Answer one tool call from the current index (rebuilt first if a change is pending).

        Raises:
            ToolNotFound: ``tool`` is not one this backend exposes.
            InvalidArguments: an argument is missing, unknown, of the wrong type or out of bounds.
            BackendUnavailable: the backend is not ready (root missing, not started) or the disk failed.
            BackendThinResult: a semantic tool while its model is loading or could not load (the reason says which),
                so a route moves on to its next rung; thin, not unavailable, so the wiki's breaker stays closed.
        """
        spec = self._tools.get(tool)
        if spec is None:
            raise ToolNotFound(tool)
        valid = spec.arguments.prepare(tool, arguments)
        if self._status.state not in (BackendState.READY, BackendState.DEGRADED):
            raise BackendUnavailable(self._name, self._status.reason or f"the wiki is {self._status.state}")
        index = await self._fresh_index()
        if spec.semantic:
            await self._fresh_semantic(index)
        with map_wiki_errors(self._name):
            if spec.blocking:
                return await anyio.to_thread.run_sync(spec.handler, index, valid)
            return spec.handler(index, valid)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch the root, index it, report READY (or FAILED with the reason), then keep the index fresh.

        A missing root, or a watcher that cannot start, is retried every few seconds. A watcher that fails is replaced
        at once; if it had failed within seconds of starting, the backend is DEGRADED (each call rebuilds the index)
        until the retry.
        """
        if self._ran:
            raise RuntimeError("WikiBackend.run() can only be called once per instance.")
        self._ran = True
        async with anyio.create_task_group() as tg:
            await tg.start(self._serve_index)
            if self._semantic_wanted:  # after READY: the model and the vectors are off startup's critical path
                tg.start_soon(self._serve_semantic)
            task_status.started()

    async def _serve_index(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch and index the root until cancelled; ``task_status.started()`` at the first outcome (READY, or the
        first failure). A watch that could not start, or ended within ``_ROOT_RETRY_S``, is tried again after
        ``_ROOT_RETRY_S``; one that ran longer is replaced at once."""
        await supervise(self._serve_root, retry=_NotWatching, wait=wait_fixed(_ROOT_RETRY_S), task_status=task_status)

    async def _serve_root(self, on_ready: Callable[[], None]) -> None:
        """One watch of the root (natively, else by polling), the index built once it is installed and rebuilt after
        each relevant change, until the root vanishes or the watcher fails. Returns when a watcher that ran longer
        than ``_ROOT_RETRY_S`` failed (its error is sticky, e.g. after one file name that is not UTF-8: a new one is
        started at once).

        Raises:
            _NotWatching: the root is missing or not a folder, or vanished, or cannot be watched (FAILED); or the
                watcher failed soon after it started (DEGRADED: each call rebuilds the index until the retry).
        """
        problem = await anyio.to_thread.run_sync(self._root_problem)
        if problem is not None:
            self._not_watching(BackendState.FAILED, problem)
        opened = time.monotonic()
        outcome, reason = await self._watch(polling=False, on_ready=on_ready)
        if outcome == "refused":
            log.warning("wiki.watch_polling", backend=self._name, reason=reason)
            native = reason
            outcome, reason = await self._watch(polling=True, on_ready=on_ready)
            if outcome == "refused":
                self._not_watching(BackendState.FAILED, f"cannot watch wiki root {self._root}: {native}")
        if outcome == "gone":
            self._not_watching(BackendState.FAILED, reason)
        if time.monotonic() - opened > _ROOT_RETRY_S:
            log.warning("wiki.watch_restart", backend=self._name, reason=reason)
            return
        self._not_watching(BackendState.DEGRADED, f"{reason}; the index is rebuilt on every call")

    def _not_watching(self, state: BackendState, reason: str) -> NoReturn:
        if state is BackendState.DEGRADED:
            self._set_state(state, reason, tool_count=len(self._tools))
        else:
            self._set_state(state, reason)
        raise _NotWatching(reason)

    # ------------------------------------------------------------------ the semantic index

    async def _serve_semantic(self) -> None:
        """Load the model (worker thread), build the semantic index, then follow every keyword index build."""
        try:
            # abandon_on_cancel: loading touches nothing shared, so shutdown need not wait for it (the interpreter's
            # exit does, for the second or so a load takes).
            self._embedder = await anyio.to_thread.run_sync(self._load_model, abandon_on_cancel=True)
        except SemanticUnavailable as exc:
            self._semantic_state, self._semantic_reason = "disabled", exc.reason
            self._semantic_changed.set()
            log.warning("wiki.semantic_disabled", backend=self._name, reason=exc.reason)
            # The wiki stays READY (its other tools work); the reason is its last error, and every semantic call's
            # step says it too.
            self._set_status(dataclasses.replace(self._status, last_error=f"semantic search disabled: {exc.reason}"))
            return
        log.info("wiki.semantic_model", backend=self._name, model=self._embedder.source, seconds=self._embedder.load_s)
        while True:
            seen = self._generation
            index = self._index
            if index is not None:
                with map_wiki_errors(self._name):
                    await self._build_semantic(index)
            await self.wait_index_generation(seen + 1)

    async def _fresh_semantic(self, index: _Index) -> None:
        """Make the semantic snapshot follow ``index`` (embedding only the pages that changed).

        Raises:
            BackendThinResult: the model is loading or could not load, or the first build is not finished.
        """
        if self._semantic_state == "disabled":
            raise BackendThinResult(self._name, f"semantic search is disabled: {self._semantic_reason}")
        if self._embedder is None or self._semantic is None:
            what = "the embedding model is loading" if self._embedder is None else "the sections are being embedded"
            raise BackendThinResult(self._name, f"semantic search is not ready yet: {what}")
        if self._semantic.source is not index:
            await self._build_semantic(index)

    def _semantic_view(self) -> tuple[SemanticIndex, Embedder]:
        semantic, embedder = self._semantic, self._embedder
        assert semantic is not None and embedder is not None  # call_tool made them current
        return semantic, embedder

    async def _build_semantic(self, index: _Index) -> None:
        async with self._semantic_lock:
            newest = self._index if self._index is not None else index  # an index is only ever replaced by a newer one
            previous = self._semantic
            if previous is not None and previous.source is newest:
                return
            embedder = self._embedder
            assert embedder is not None
            generation = self._generation
            # Abandoned on cancel, and the thread itself stops at its next chunk: an abandoned worker thread still
            # holds the interpreter's exit (threading's shutdown joins it), so a stopping gateway would otherwise
            # linger, embedding, until the whole wiki was done.
            semantic = await anyio.to_thread.run_sync(
                build_semantic, embedder, newest, previous, anyio.from_thread.check_cancelled, abandon_on_cancel=True
            )
            self._semantic, self._semantic_generation = semantic, generation
            self._semantic_state = "ready"
            self._semantic_changed.set()
            self._semantic_changed = anyio.Event()
            log.debug(
                "wiki.semantic_indexed",
                backend=self._name,
                sections=len(semantic.sections),
                embedded=semantic.embedded,
                seconds=semantic.build_s,
            )

    # ------------------------------------------------------------------ extras

    def statistics(self) -> WikiStatistics:
        index = self._index
        return WikiStatistics(
            generation=self._generation,
            pages=len(index.pages) if index else 0,
            bytes=index.total_bytes if index else 0,
            dirty=self._indexed_changes != self._changes,
            watching=self._watching,
            last_build_s=self._last_build_s,
            semantic=f"disabled: {self._semantic_reason}"
            if self._semantic_state == "disabled"
            else self._semantic_state,
            semantic_sections=len(self._semantic.sections) if self._semantic is not None else 0,
            semantic_generation=self._semantic_generation,
            semantic_build_s=self._semantic.build_s if self._semantic is not None else 0.0,
            model_load_s=self._embedder.load_s if self._embedder is not None else 0.0,
        )

    async def wait_index_generation(self, generation: int) -> None:
        """Wait until the index has been built at least ``generation`` times (see ``statistics().generation``)."""
        while self._generation < generation:
            await self._generation_changed.wait()

    async def wait_semantic(self, generation: int) -> None:
        """Wait until the semantic index follows index generation ``generation`` or more, or semantic search is off
        or disabled (see ``statistics().semantic``)."""
        while self._semantic_state in ("loading", "ready") and self._semantic_generation < generation:
            await self._semantic_changed.wait()

    def estimates(self) -> Mapping[str, int]:
        return self.measure() if self._status.state is BackendState.READY else {}

    def measure(self) -> dict[str, int]:
        """The output size, in tokens, of ``wiki_index`` and ``wiki_read_all`` (handlers.estimate_tokens) over the
        current index; before ``run`` has built one, over one built now (blocking, and not kept)."""
        index = self._index if self._index is not None else _build_index(self._root_real)
        return estimate_tokens(index, self._read_all_max_bytes)

    # ------------------------------------------------------------------ index lifecycle

    async def _fresh_index(self) -> _Index:
        if not self._watching:
            self._changes += 1  # nothing tells us about changes: every call sees a fresh walk
        if self._index is not None and self._indexed_changes == self._changes:
            return self._index
        async with self._build_lock:
            if self._index is None or self._indexed_changes != self._changes:
                seen = self._changes
                changed, self._changed_paths = self._changed_paths, set()
                previous = self._index.parsed if self._index is not None else None
                began = time.perf_counter()
                try:
                    with map_wiki_errors(self._name):
                        index = await anyio.to_thread.run_sync(_build_index, self._root_real, previous, changed)
                except BaseException:
                    self._changed_paths |= changed
                    raise
                self._last_build_s = time.perf_counter() - began
                self._index, self._indexed_changes = index, seen
                self._generation += 1
                self._generation_changed.set()
                self._generation_changed = anyio.Event()
                log.debug("wiki.indexed", backend=self._name, pages=len(index.pages), seconds=self._last_build_s)
            assert self._index is not None
            return self._index

    def _root_problem(self) -> str | None:
        """Why the root cannot be watched now (missing, not a folder), or None; resolves it. Blocking."""
        if not self._root.exists():
            return f"wiki root {self._root} does not exist"
        if not self._root.is_dir():
            return f"wiki root {self._root} is not a directory"
        self._root_real = self._root.resolve()
        return None

    async def _watch(
        self, *, polling: bool, on_ready: Callable[[], None]
    ) -> tuple[Literal["refused", "gone", "error"], str]:
        """Watch the root with ``watchfiles.watch`` (stepped in worker threads), index it once the watch is installed
        (so no change falls between the two), report READY, then rebuild after each relevant batch of changes.

        Returns ``(outcome, reason)`` when the watch ends: ``refused`` (it could not be installed), ``gone`` (the root
        vanished) or ``error`` (the watcher failed).
        """
        installed = anyio.Event()
        token = anyio.lowlevel.current_token()
        stop = _StopEvent(lambda: anyio.from_thread.run_sync(installed.set, token=token))
        changes = watchfiles.watch(
            self._root_real,
            watch_filter=None,
            debounce=_WATCH_DEBOUNCE_MS,
            step=_WATCH_STEP_MS,
            stop_event=stop,
            rust_timeout=0,  # no timeout: the stop event ends a wait (a timeout would also drop changes racing it)
            debug=False,
            raise_interrupt=False,
            force_polling=polling,
            poll_delay_ms=_WATCH_POLL_DELAY_MS,
            ignore_permission_denied=True,
        )
        ended: tuple[Literal["gone", "error"], str] = ("error", "the watch ended")
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_set_when_cancelled, stop)

                async def follow() -> None:
                    nonlocal ended
                    ended = await self._follow(changes)
                    tg.cancel_scope.cancel()

                tg.start_soon(follow)
                await installed.wait()
                self._watching = True
                self._changes += 1  # index after the watch is installed: no change falls between the two
                await self._fresh_index()
                self._set_state(BackendState.READY, tool_count=len(self._tools))
                on_ready()
        finally:
            self._watching = False
            changes.close()  # no worker runs it now: the task group waited for them
        outcome, reason = ended
        if not installed.is_set():
            return "refused", reason
        if outcome == "error":
            return "error", f"file watching failed: {reason}"
        return "gone", reason

    async def _follow(
        self, changes: Iterator[set[tuple[watchfiles.Change, str]]]
    ) -> tuple[Literal["gone", "error"], str]:
        """Rebuild the index after each relevant batch of changes until the root vanishes or the watcher fails."""
        while True:
            outcome, reason, paths = await anyio.to_thread.run_sync(self._wait_for_change, changes)
            if outcome == "stop":  # we are being cancelled: let the pending cancellation land
                await anyio.sleep_forever()
            elif outcome == "changed":
                self._changed_paths |= paths
                self._changes += 1
                await self._fresh_index()
            else:
                return outcome, reason

    def _wait_for_change(
        self, changes: Iterator[set[tuple[watchfiles.Change, str]]]
    ) -> tuple[Literal["changed", "stop", "gone", "error"], str, set[str]]:
        """Block until a change that matters to the index: ``(outcome, reason, changed relative paths)``."""
        while True:
            try:
                raw = next(changes, None)
            except (OSError, RuntimeError) as exc:  # the watch could not be installed, or its watcher failed
                return "error", str(exc) or type(exc).__name__, set()
            if raw is None:  # the stop event was set
                return "stop", "", set()
            if not self._root.is_dir():
                return "gone", f"wiki root {self._root} no longer exists", set()
            paths = {rel for _, path in raw if (rel := self._relevant(path)) is not None}
            if paths:
                return "changed", "", paths

    def _relevant(self, path: str) -> str | None:
        """The changed path relative to the root if it can matter to the index, else None."""
        try:
            parts = Path(path).relative_to(self._root_real).parts
        except ValueError:
            return ""
        if any(part.startswith(".") or part in EXCLUDED_DIRS for part in parts):
            return None
        # A page, a folder, or something deleted (maybe a folder); not an existing non-page file.
        if not parts or _is_page_name(parts[-1]) or not os.path.isfile(path):
            return "/".join(parts)
        return None


class _NotWatching(Exception):
    """The root is not watched (the backend's state says why): tried again after ``_ROOT_RETRY_S``."""


class _StopEvent:
    """The ``stop_event`` handed to ``watchfiles.watch``: ``set`` ends its wait within one step (``_WATCH_STEP_MS``).

    watchfiles polls ``is_set`` while it waits for changes, which it can do only once its watch is installed: the
    first poll calls ``on_installed`` (in the watcher's worker thread).
    """

    def __init__(self, on_installed: Callable[[], None]) -> None:
        self._stop = threading.Event()
        self._on_installed: Callable[[], None] | None = on_installed

    def set(self) -> None:
        self._stop.set()

    def is_set(self) -> bool:
        if self._on_installed is not None:
            on_installed, self._on_installed = self._on_installed, None
            on_installed()
        return self._stop.is_set()


async def _set_when_cancelled(stop: _StopEvent) -> None:
    try:
        await anyio.sleep_forever()
    finally:
        stop.set()
