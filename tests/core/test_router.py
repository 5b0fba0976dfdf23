"""The router's single error policy, driven through scripted backends: pass-through, fallback along routes and
ladders, refusals, cancellation, and exactly one audit row (and one log line) per call carrying the same chain."""

from __future__ import annotations

import re
from typing import Any

import anyio
import mcp_types as types
import pytest
from structlog.testing import capture_logs

from gateway.backends.base import Backend, BackendState
from gateway.calls import CallContext, Caller, Upstream
from gateway.config import parse_config
from gateway.core.catalog import Catalog
from gateway.core.router import META_KEY, Router
from gateway.errors import (
    BackendRpcError,
    BackendSaturated,
    BackendThinResult,
    BackendTimeout,
    BackendUnavailable,
    InvalidArguments,
    ToolNotFound,
)
from gateway.ledger.records import AuditStep, args_hash
from gateway.testing import BLOCK, FakeBackend, FakeRecorder, make_tool, text_result

pytestmark = pytest.mark.anyio

CONFIG = """
servers:
  a:
    transport: stdio
    command: x
  b:
    transport: stdio
    command: x
  solo:
    transport: stdio
    command: x
adapters:
  qmd:
    command: qmd
    tools:
      files_search:
        switch: mode
        variants: {deep: {argv: [q]}, vector: {argv: [v]}, keyword: {argv: [k]}}
        ladder: {deep: vector, vector: keyword}
        audit: {query: 5, mode: 0}
routes:
  search: [a/search, b/search]
  ask:
    - provider: b/search
      arguments: {q: "{question}", fixed: 1}
"""

LADDER = ("deep", "vector", "keyword")


class Setup:
    def __init__(self, *backends: FakeBackend) -> None:
        self.config = parse_config(CONFIG, file="federation.yaml", env={})
        self.backends: dict[str, Backend] = {b.name: b for b in backends}
        self.catalog = Catalog.build(self.config, self.backends)
        self.recorder = FakeRecorder()
        self.router = Router(lambda: self.catalog, lambda: self.backends, self.recorder)

    async def call(self, name: str, arguments: dict[str, Any] | None = None, **kw: Any) -> types.CallToolResult:
        with anyio.fail_after(5):
            return await self.router.call(name, arguments, **kw)


def fakes() -> tuple[FakeBackend, FakeBackend, FakeBackend, FakeBackend]:
    return (
        FakeBackend("a", ["search"]),
        FakeBackend("b", ["search"]),
        FakeBackend("solo", ["lookup"]),
        FakeBackend("qmd", ["files_search"], kind="adapter", ladders={"files_search": LADDER}),
    )


def meta(result: types.CallToolResult) -> dict[str, Any]:
    assert result.meta is not None and META_KEY in result.meta, result
    entry = result.meta[META_KEY]
    assert isinstance(entry, dict)
    return entry


def text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def chain(steps: Any) -> list[tuple[str, str | None, str]]:
    return [(s.provider, s.variant, s.outcome) for s in steps]


# ----------------------------------------------------------------------------------------------- answers


async def test_an_unknown_tool_raises_tool_not_found() -> None:
    setup = Setup(*fakes())
    with pytest.raises(ToolNotFound) as info:
        await setup.call("no_such_tool", {})
    assert info.value.name == "no_such_tool"
    assert all(not b.calls for b in setup.backends.values())  # type: ignore[attr-defined]


async def test_an_ok_answer_passes_through_with_the_gateways_call_entry_in_meta() -> None:
    a, b, solo, qmd = fakes()
    answer = text_result("found it", structured_content={"hits": [1, 2]}, meta={"downstream/trace": "t-1"})
    solo.script("lookup", answer)
    expected = answer.model_copy(deep=True)
    setup = Setup(a, b, solo, qmd)

    result = await setup.call("lookup", {"q": "x"})

    assert result.model_dump(exclude={"meta"}) == expected.model_dump(exclude={"meta"})
    assert result.meta is not None and result.meta["downstream/trace"] == "t-1"
    entry = meta(result)
    assert re.fullmatch(r"[0-9a-f]{16}", entry["id"])
    assert (entry["status"], entry["served_by"]) == ("ok", "solo/lookup")
    assert "steps" not in entry and "variant" not in entry
    assert solo.calls[0].arguments == {"q": "x"}


async def test_a_downstream_is_error_answer_passes_through_untouched_with_status_error() -> None:
    a, b, solo, qmd = fakes()
    answer = types.CallToolResult(
        content=[types.TextContent(text="no such node"), types.ImageContent(data="aGk=", mime_type="image/png")],
        structured_content={"error": {"code": "ENOENT", "path": ["x", 1]}},
        is_error=True,
    )
    answer.meta = {"downstream": {"k": 1}}
    a.script("search", answer)
    expected = answer.model_copy(deep=True)
    setup = Setup(a, b, solo, qmd)

    result = await setup.call("search", {"q": "x"})

    assert result.is_error is True
    assert result.content == expected.content
    assert result.structured_content == expected.structured_content
    assert result.model_dump(exclude={"meta"}) == expected.model_dump(exclude={"meta"})
    assert result.meta is not None and result.meta["downstream"] == {"k": 1}
    assert (meta(result)["status"], meta(result)["served_by"]) == ("error", "a/search")
    assert b.calls == []  # an isError answer is an answer: no fallback
    assert [r.status for r in setup.recorder.records] == ["error"]


async def test_a_route_sends_each_provider_its_templated_arguments() -> None:
    a, b, solo, qmd = fakes()
    setup = Setup(a, b, solo, qmd)
    await setup.call("ask", {"question": "why?", "extra": True})
    assert b.calls[0].arguments == {"q": "why?", "fixed": 1}
    assert setup.recorder.records[0].args_hash == args_hash({"question": "why?", "extra": True})


# ----------------------------------------------------------------------------------------------- fallback


async def test_a_timeout_on_the_first_provider_moves_to_the_next_and_says_so() -> None:
    a, b, solo, qmd = fakes()
    a.script("search", BackendTimeout("a", "timed out after 15 s"))
    b.script("search", text_result("from b"))
    setup = Setup(a, b, solo, qmd)

    result = await setup.call("search", {"q": "x"})

    assert text(result) == (
        "from b\n[gateway] Degraded answer: a/search could not serve this call (timeout: timed out after 15 s); "
        "b/search answered instead."
    )  # where the model reads it, since no client shows it _meta
    assert not result.is_error
    entry = meta(result)
    assert (entry["status"], entry["served_by"]) == ("degraded", "b/search")
    assert entry["requested"] == {"provider": "a/search", "variant": None}
    steps = entry["steps"]
    assert [(s["provider"], s["outcome"]) for s in steps] == [("a/search", "timeout"), ("b/search", "ok")]
    assert steps[0]["reason"] == "timed out after 15 s"
    assert steps[1]["reason"] is None
    assert all(isinstance(s["ms"], float) and s["ms"] >= 0 for s in steps)
    assert [c.tool for c in a.calls] == ["search"] and [c.tool for c in b.calls] == ["search"]


async def test_a_ladder_degrades_rung_by_rung_until_one_answers() -> None:
    a, b, solo, qmd = fakes()
    qmd.script("files_search", BackendTimeout("qmd", "timed out after 120 s"), variant="deep")
    qmd.script("files_search", BackendThinResult("qmd", "no embeddings: empty answer"), variant="vector")
    qmd.script("files_search", text_result('[{"doc": 1}]'), variant="keyword")
    setup = Setup(a, b, solo, qmd)

    result = await setup.call("files_search", {"query": "cats", "mode": "deep"})

    assert [c.variant for c in qmd.calls] == ["deep", "vector", "keyword"]
    assert [block.text for block in result.content] == [  # type: ignore[union-attr]
        '[{"doc": 1}]',
        "[gateway] Degraded answer: qmd/files_search [deep] could not serve this call (timeout: timed out after "
        "120 s) (and 1 more step); qmd/files_search [keyword] answered instead.",
    ]
    entry = meta(result)
    assert (entry["status"], entry["served_by"], entry["variant"]) == ("degraded", "qmd/files_search", "keyword")
    assert entry["requested"] == {"provider": "qmd/files_search", "variant": "deep"}
    assert [(s["variant"], s["outcome"], s["reason"]) for s in entry["steps"]] == [
        ("deep", "timeout", "timed out after 120 s"),
        ("vector", "thin", "no embeddings: empty answer"),
        ("keyword", "ok", None),
    ]


async def test_a_degraded_structured_result_gets_no_field_its_output_schema_forbids() -> None:
    closed = {"type": "object", "properties": {"n": {"type": "integer"}}, "additionalProperties": False}
    a = FakeBackend("a", [make_tool("search", output_schema=closed)])
    b = FakeBackend("b", [make_tool("search", output_schema=closed)])
    a.script("search", BackendUnavailable("a", "connection refused"))
    b.script("search", text_result("1", structured_content={"n": 1}))
    setup = Setup(a, b, *fakes()[2:])

    result = await setup.call("search", {"q": "x"})

    assert meta(result)["status"] == "degraded"
    assert result.structured_content == {"n": 1}  # still valid against the schema a client may check it with
    assert text(result).endswith("b/search answered instead.")


@pytest.mark.parametrize(
    ("second", "status"),
    [
        (BackendTimeout("b", "timed out after 3 s"), "timeout"),
        (BackendUnavailable("b", "connection refused"), "error"),
    ],
)
async def test_when_every_provider_fails_the_answer_is_an_error_naming_each_backend_and_cause(
    second: Exception, status: str
) -> None:
    a, b, solo, qmd = fakes()
    a.script("search", BackendUnavailable("a", "process exited with code 1: boom"))
    b.script("search", second)
    setup = Setup(a, b, solo, qmd)

    result = await setup.call("search", {"q": "x"})

    assert result.is_error is True
    message = text(result)
    assert "a/search" in message and "process exited with code 1: boom" in message
    assert "b/search" in message and second.reason in message  # type: ignore[attr-defined]
    assert meta(result)["status"] == status
    assert [s["outcome"] for s in meta(result)["steps"]] == ["unavailable", second.outcome]  # type: ignore[attr-defined]
    assert [r.status for r in setup.recorder.records] == [status]


async def test_a_saturated_provider_moves_to_the_next_and_never_counts_against_its_circuit() -> None:
    a, b, solo, qmd = fakes()
    for _ in range(8):  # beyond the breaker's threshold of 5
        a.script("search", BackendSaturated("a", "every connection to a is busy"))
        b.script("search", text_result("from b"))
    setup = Setup(a, b, solo, qmd)

    for _ in range(8):
        result = await setup.call("search", {"q": "x"})
        assert text(result).split("\n")[0] == "from b"  # then the degradation line, which names why (saturated)
        assert "(saturated: every connection to a is busy)" in text(result)
        assert [s["outcome"] for s in meta(result)["steps"]] == ["saturated", "ok"]
    breaker = setup.router.breakers["a"]
    assert (breaker.state, breaker.failures) == ("closed", 0)
    assert len(a.calls) == 8  # never skipped as circuit_open


async def test_when_every_provider_fails_meta_names_no_server() -> None:
    a, b, solo, qmd = fakes()
    a.script("search", BackendUnavailable("a", "down"))
    b.script("search", BackendUnavailable("b", "down"))
    result = await Setup(a, b, solo, qmd).call("search", {})
    assert result.is_error
    assert meta(result).get("served_by") is None


async def test_a_lone_providers_json_rpc_error_is_re_raised_as_that_error() -> None:
    a, b, solo, qmd = fakes()
    error = BackendRpcError("solo", -32001, "quota exceeded", {"retry_after": 30})
    solo.script("lookup", error)
    setup = Setup(a, b, solo, qmd)

    with pytest.raises(BackendRpcError) as info:
        await setup.call("lookup", {})

    assert info.value is error
    assert (info.value.code, info.value.message, info.value.data) == (-32001, "quota exceeded", {"retry_after": 30})
    assert len(setup.recorder.records) == 1
    assert chain(setup.recorder.records[0].chain) == [("solo/lookup", None, "rpc_error")]


async def test_a_json_rpc_error_with_a_fallback_moves_on_instead_of_raising() -> None:
    a, b, solo, qmd = fakes()
    a.script("search", BackendRpcError("a", -32603, "internal"))
    result = await Setup(a, b, solo, qmd).call("search", {})
    assert not result.is_error
    assert meta(result)["served_by"] == "b/search"
    assert meta(result)["steps"][0]["outcome"] == "rpc_error"


async def test_invalid_arguments_are_refused_naming_the_argument_without_any_fallback() -> None:
    a, b, solo, qmd = fakes()
    a.script("search", InvalidArguments("search", "limit", "must be at most 50"))
    setup = Setup(a, b, solo, qmd)

    result = await setup.call("search", {"q": "x", "limit": 500})

    assert result.is_error is True
    assert "'limit'" in text(result) and "must be at most 50" in text(result)
    assert meta(result)["status"] == "refused"
    assert b.calls == []
    assert [r.status for r in setup.recorder.records] == ["refused"]
    assert chain(setup.recorder.records[0].chain) == [("a/search", None, "refused")]


async def test_invalid_arguments_stop_a_ladder_at_the_first_rung() -> None:
    a, b, solo, qmd = fakes()
    qmd.script("files_search", InvalidArguments("files_search", "query", "must not be empty"), variant="deep")
    result = await Setup(a, b, solo, qmd).call("files_search", {"query": "", "mode": "deep"})
    assert result.is_error and "'query'" in text(result)
    assert [c.variant for c in qmd.calls] == ["deep"]


async def test_a_disabled_provider_is_skipped_with_its_declared_reason() -> None:
    a, b, solo, qmd = fakes()
    setup = Setup(a, b, solo, qmd)
    a.set_state(BackendState.DISABLED, "down for maintenance", declared=True)

    result = await setup.call("search", {"q": "x"})

    assert a.calls == []
    assert meta(result)["served_by"] == "b/search"
    first = meta(result)["steps"][0]
    assert (first["provider"], first["outcome"], first["reason"]) == ("a/search", "disabled", "down for maintenance")
    assert chain(setup.recorder.records[0].chain) == [("a/search", None, "disabled"), ("b/search", None, "ok")]


async def test_a_failed_server_is_skipped_as_unavailable_with_the_detected_reason() -> None:
    a, b, solo, qmd = fakes()
    setup = Setup(a, b, solo, qmd)
    a.set_state(BackendState.FAILED, "handshake answered HTTP 502")

    result = await setup.call("search", {})

    assert a.calls == []
    first = meta(result)["steps"][0]
    assert (first["outcome"], first["reason"]) == ("unavailable", "handshake answered HTTP 502")


class OwnSessions(FakeBackend):
    """A server whose callers have sessions of their own (an OAuth server, per caller): alice's is open."""

    def serves(self, caller: str | None) -> bool:
        return super().serves(caller) or caller == "alice"


async def test_a_caller_with_a_session_of_their_own_is_served_while_the_shared_one_reconnects() -> None:
    solo = OwnSessions("solo", ["lookup"], list_when_down=True)
    setup = Setup(solo)
    solo.set_state(BackendState.FAILED, "signed out: open http://gw/ui/connect/solo to sign in")

    def as_(caller: str) -> CallContext:
        return CallContext(upstream=Upstream(Caller(caller)))

    served = await setup.call("lookup", {}, ctx=as_("alice"))
    refused = await setup.call("lookup", {}, ctx=as_("bob"))

    assert meta(served)["status"] == "ok" and len(solo.calls) == 1
    assert refused.is_error and "sign in" in refused.content[0].text  # type: ignore[union-attr]
    assert chain(setup.recorder.records[1].chain) == [("solo/lookup", None, "unavailable")]


async def test_a_failed_adapter_is_still_tried_because_it_spawns_per_call() -> None:
    a, b, solo, qmd = fakes()
    setup = Setup(a, b, solo, qmd)
    qmd.set_state(BackendState.FAILED, "probe failed")
    result = await setup.call("files_search", {"query": "x", "mode": "deep"})
    assert [c.variant for c in qmd.calls] == ["deep"]
    assert meta(result)["status"] == "ok"


# ----------------------------------------------------------------------------------------------- cancellation


async def test_cancelling_the_caller_records_a_cancelled_row_and_re_raises() -> None:
    a, b, solo, qmd = fakes()
    solo.script("lookup", BLOCK)
    setup = Setup(a, b, solo, qmd)
    outcome: list[str] = []

    async def caller() -> None:
        try:
            await setup.router.call("lookup", {"q": "x"})
        except anyio.get_cancelled_exc_class():
            outcome.append("cancelled")
            raise
        outcome.append("returned")  # pragma: no cover - the failure this test exists to catch

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller)
            await solo.entered.wait()
            tg.cancel_scope.cancel()

    assert outcome == ["cancelled"]
    assert len(setup.recorder.records) == 1
    record = setup.recorder.records[0]
    assert (record.status, record.tool, record.args_hash) == ("cancelled", "lookup", args_hash({"q": "x"}))


class Starting:
    """A startup wait that lasts until ``done`` is set, or fails with ``fault`` (the Startup protocol of the router)."""

    def __init__(self, fault: Exception | None = None) -> None:
        self.started = False
        self.waiting, self.done, self.fault = anyio.Event(), anyio.Event(), fault

    async def wait_started(self) -> None:
        self.waiting.set()
        if self.fault is not None:
            raise self.fault
        await self.done.wait()
        self.started = True


def starting_setup(startup: Starting) -> Setup:
    setup = Setup(*fakes())
    setup.router = Router(lambda: setup.catalog, lambda: setup.backends, setup.recorder, startup=startup)
    return setup


@pytest.mark.parametrize("kind", ["tools/call", "resources/read"])
async def test_a_request_cancelled_during_the_startup_wait_leaves_one_cancelled_row_and_re_raises(kind: str) -> None:
    startup = Starting()
    setup = starting_setup(startup)
    outcome: list[str] = []

    async def caller() -> None:
        try:
            await setup.router.wait_started(kind, "not_yet_known", arguments={"q": "x"})
        except anyio.get_cancelled_exc_class():
            outcome.append("cancelled")
            raise

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller)
            await startup.waiting.wait()
            tg.cancel_scope.cancel()
    assert outcome == ["cancelled"]
    [record] = setup.recorder.records
    assert (record.kind, record.tool, record.status, record.args_hash) == (
        kind,
        "not_yet_known",
        "cancelled",
        args_hash({"q": "x"}),
    )
    assert chain(record.chain) == [("gateway", None, "cancelled")]
    assert record.chain[0].reason == "cancelled while waiting for backends still starting"


async def test_a_startup_wait_that_fails_leaves_an_internal_error_row_and_the_error_goes_on() -> None:
    setup = starting_setup(Starting(fault=RuntimeError("boom")))
    with anyio.fail_after(5), pytest.raises(RuntimeError):
        await setup.router.wait_started("prompts/get", "greet")
    [record] = setup.recorder.records
    assert (record.kind, record.tool, record.status) == ("prompts/get", "greet", "internal_error")
    assert [(s.provider, s.outcome, s.reason) for s in record.chain] == [
        ("gateway", "internal_error", "RuntimeError while waiting for backends still starting")
    ]


async def test_the_gateway_stopping_ends_the_startup_wait_and_the_call_is_answered_cancelled_with_one_row() -> None:
    startup = Starting()
    setup = starting_setup(startup)
    answers: list[types.CallToolResult] = []

    async def caller() -> None:
        await setup.router.wait_started("tools/call", "lookup")
        answers.append(await setup.router.call("lookup", {"q": "x"}))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller)
            await startup.waiting.wait()
            assert setup.router.drain.calls_in_progress() == 1  # a drain waits for it like for any call
            setup.router.drain.abort("the gateway is shutting down")
    [answer] = answers
    assert answer.is_error and "the gateway is shutting down" in answer.content[0].text  # type: ignore[union-attr]
    assert [r.status for r in setup.recorder.records] == ["cancelled"]

    with anyio.fail_after(5):  # one that arrives once the gateway is stopping does not wait at all
        await setup.router.wait_started("tools/call", "lookup")
    assert len(setup.recorder.records) == 1


async def test_once_startup_is_over_the_wait_returns_at_once_and_writes_nothing() -> None:
    startup = Starting()
    startup.started = True
    setup = starting_setup(startup)
    with anyio.fail_after(5):
        await setup.router.wait_started("tools/call", "lookup")
    assert not startup.waiting.is_set() and setup.recorder.records == []


# ----------------------------------------------------------------------------------------------- audit and log


async def test_each_call_leaves_exactly_one_audit_row_with_its_chain_hash_and_declared_previews() -> None:
    a, b, solo, qmd = fakes()
    qmd.script("files_search", BackendTimeout("qmd", "timed out after 120 s"), variant="deep")
    setup = Setup(a, b, solo, qmd)
    arguments = {"query": "hello world", "mode": "deep", "limit": 3, "token": "not-for-the-ledger"}
    ctx = CallContext(
        upstream=Upstream(Caller("alice")), session_id="s-1", client_name="claude-code", client_version="1.0"
    )

    result = await setup.call("files_search", arguments, ctx=ctx)
    await setup.call("lookup", {"q": 1})

    assert len(setup.recorder.records) == 2
    record = setup.recorder.records[0]
    assert record.correlation_id == meta(result)["id"]
    assert (record.tool, record.status) == ("files_search", "degraded")
    assert (record.session_id, record.client_name, record.client_version, record.caller) == (
        "s-1",
        "claude-code",
        "1.0",
        "alice",
    )
    assert chain(record.chain) == [
        ("qmd/files_search", "deep", "timeout"),
        ("qmd/files_search", "vector", "ok"),
    ]
    assert all(isinstance(step, AuditStep) for step in record.chain)
    assert record.chain[0].reason == "timed out after 120 s"
    assert record.args_hash == args_hash(arguments)
    assert dict(record.arg_preview) == {"query": "hello…", "mode": "deep"}  # only the audit keys; query cut at 5
    assert "not-for-the-ledger" not in repr(record)
    assert record.result_bytes == sum(len(block.text.encode()) for block in result.content)  # type: ignore[union-attr]
    assert record.duration_ms >= 0

    second = setup.recorder.records[1]
    assert (second.tool, second.status, dict(second.arg_preview)) == ("lookup", "ok", {})
    assert second.correlation_id != record.correlation_id


async def test_each_call_writes_one_canonical_log_line_with_the_same_chain() -> None:
    a, b, solo, qmd = fakes()
    a.script("search", BackendTimeout("a", "timed out after 15 s"))
    setup = Setup(a, b, solo, qmd)
    with capture_logs() as logs:
        result = await setup.call("search", {"q": "x"})
    lines = [event for event in logs if event["event"] == "tool.call"]
    assert len(lines) == 1
    line = lines[0]
    assert (line["status"], line["served_by"]) == ("degraded", "b/search")
    assert line["chain"] == ["a/search:timeout", "b/search:ok"]
    assert len(line["chain"]) == len(meta(result)["steps"]) == len(setup.recorder.records[0].chain)


# ----------------------------------------------------------------------------------------------- the per-call boundary


async def test_an_unknown_tool_leaves_one_row_of_status_unknown_tool_with_its_name_cut() -> None:
    setup = Setup(*fakes())
    with pytest.raises(ToolNotFound) as info:
        await setup.call("x" * 4_000_000, {"q": "y"})
    assert str(info.value) == f"Unknown tool: {'x' * 120!r}… (4,000,000 characters)."
    [record] = setup.recorder.records
    assert (record.tool, record.status, record.chain, record.arg_preview) == ("x" * 120, "unknown_tool", (), {})


@pytest.mark.parametrize(
    ("arguments", "argument", "reason"),
    [
        ({"q": "\ud800"}, "q", "it holds a lone surrogate (U+D800 at character 0)"),
        ({"q": {"\udc00": 1}}, "q", "at 'q.\\udc00', its key: it holds a lone surrogate (U+DC00 at character 0)"),
        ({"q": [[[[1]]]]}, "q", "at 'q.0.0', the value is nested more than 3 levels deep (the limit)"),
    ],
)
async def test_unsendable_arguments_are_invalid_params_with_a_row_and_no_backend_call(
    arguments: dict[str, Any], argument: str, reason: str
) -> None:
    a, b, solo, qmd = fakes()
    setup = Setup(a, b, solo, qmd)
    setup.router = Router(
        lambda: setup.catalog,
        lambda: setup.backends,
        setup.recorder,
        edge=lambda: parse_config("gateway: {edge: {max_argument_depth: 3}}", file="f", env={}).gateway.edge,
    )
    with pytest.raises(InvalidArguments) as info:
        await setup.call("lookup", arguments)
    assert info.value.argument == argument and info.value.message.startswith(reason)
    assert solo.calls == []
    [record] = setup.recorder.records
    assert (record.tool, record.status, chain(record.chain)) == (
        "lookup",
        "invalid_params",
        [("gateway", None, "invalid_params")],
    )


async def test_an_unexpected_exception_ends_only_its_own_call_with_a_row_and_one_log_line() -> None:
    a, b, solo, qmd = fakes()
    solo.script("lookup", RuntimeError("bug in a backend"))
    setup = Setup(a, b, solo, qmd)
    with capture_logs() as logs:
        failed = await setup.call("lookup", {"q": "first"})
    assert failed.is_error
    assert text(failed) == (
        "Tool 'lookup' failed: the gateway hit an unexpected error (RuntimeError) while serving this call; "
        "other calls are not affected."
    )
    assert meta(failed)["status"] == "internal_error"
    assert [entry["event"] for entry in logs if entry["log_level"] == "error"] == ["tool.internal_error"]
    bystander = await setup.call("lookup", {"q": "second"})  # the same backend, the next call
    assert text(bystander) == "solo/lookup answered" and not bystander.is_error
    statuses = [(r.status, chain(r.chain)) for r in setup.recorder.records]
    assert statuses == [
        ("internal_error", [("solo/lookup", None, "internal_error")]),
        ("ok", [("solo/lookup", None, "ok")]),
    ]


async def test_a_cancelled_calls_row_names_the_step_that_was_under_way() -> None:
    a, b, solo, qmd = fakes()
    a.script("search", BackendTimeout("a", "timed out after 1 s"))
    b.script("search", BLOCK)
    setup = Setup(a, b, solo, qmd)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(setup.router.call, "search", {"q": "x"})
            await b.entered.wait()
            tg.cancel_scope.cancel()
    [record] = setup.recorder.records
    assert record.status == "cancelled"
    assert chain(record.chain) == [("a/search", None, "timeout"), ("b/search", None, "cancelled")]
    assert record.chain[1].reason == "cancelled while under way"


async def test_a_backends_refusal_of_its_arguments_names_the_published_tool_and_argument() -> None:
    a, b, solo, qmd = fakes()
    b.script("search", InvalidArguments("search", "q", "unknown argument (expected: none)"))
    setup = Setup(a, b, solo, qmd)
    result = await setup.call("ask", {"question": "x"})  # route `ask` sends b/search its `question` as `q`
    assert result.is_error
    assert text(result) == "Invalid argument 'question' for tool 'ask': unknown argument (expected: none)"


async def test_a_call_to_a_lost_backends_last_known_tool_is_answered_at_once_naming_it_and_why() -> None:
    a, b, solo, qmd = fakes()
    solo.set_state(BackendState.READY)
    solo.set_state(BackendState.FAILED, "the connection closed; process exited with code 3")
    setup = Setup(a, b, solo, qmd)  # the catalog built while solo is down still lists its `lookup`
    result = await setup.call("lookup", {"q": "x"})
    assert result.is_error and solo.calls == []
    assert text(result) == (
        "Tool 'lookup' failed: every provider failed. "
        "solo/lookup: unavailable (the connection closed; process exited with code 3)"
    )
    [record] = setup.recorder.records
    assert (record.status, chain(record.chain)) == ("error", [("solo/lookup", None, "unavailable")])
