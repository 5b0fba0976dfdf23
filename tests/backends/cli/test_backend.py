"""The command-line adapter: argv rules, schema checks and answer mapping against a fake process (the spawn seam);
timeouts, process groups, caps, concurrency and the environment against real subprocesses (tests/fixtures/fake_cli.py).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
import pytest

from gateway.backends.base import BackendState, BackendStatus
from gateway.backends.cli import backend as cli_module
from gateway.backends.cli.argv import build_argv
from gateway.backends.cli.backend import CliBackend
from gateway.backends.cli.runs import ChildProcess
from gateway.config import Adapter
from gateway.errors import (
    BackendError,
    BackendProtocolError,
    BackendThinResult,
    BackendTimeout,
    BackendUnavailable,
    InvalidArguments,
    ToolNotFound,
)
from tests.fixtures import FIXTURES
from tests.fixtures.procs import read_pids

FAKE_CLI = str(FIXTURES / "fake_cli.py")
PY = sys.executable
HAS_PROC = Path("/proc/self/stat").exists()
needs_proc = pytest.mark.skipif(not HAS_PROC, reason="inspects processes through /proc")

SEARCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["query"],
    "additionalProperties": False,
    "properties": {
        "query": {"type": "string", "minLength": 1},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
        "mode": {"enum": ["keyword", "vector", "deep"], "default": "vector"},
    },
}


def adapter(tools: dict[str, Any], **settings: Any) -> Adapter:
    return Adapter.model_validate({"command": PY, "tools": tools, **settings})


def fake_tool(mode: str, *extra: str, **spec: Any) -> dict[str, Any]:
    """A tool that runs ``python fake_cli.py MODE EXTRA...`` (schema: free-form object unless given)."""
    spec.setdefault("input_schema", {"type": "object"})
    return {"argv": [FAKE_CLI, mode, *extra], **spec}


async def wait_until(predicate: Callable[[], bool], within_s: float = 10.0) -> None:
    """Poll a condition (a process state the OS gives no event for), bounded."""
    with anyio.fail_after(within_s):
        while True:
            if predicate():
                return
            await anyio.sleep(0.01)


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (this machine's init does not reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def text_of(result: types.CallToolResult) -> str:
    [content] = result.content
    assert isinstance(content, types.TextContent)
    return content.text


def count(folder: Path, pattern: str) -> int:
    return len(list(folder.glob(pattern)))


def same_folder(a: str | Path, b: str | Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


# --------------------------------------------------------------------------------------------------- the fake seam


class FakeStream(anyio.abc.ByteReceiveStream):
    def __init__(self, data: bytes, until: anyio.Event | None) -> None:
        self._data = data
        self._until = until

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._data:
            chunk, self._data = self._data[:max_bytes], self._data[max_bytes:]
            return chunk
        if self._until is not None:
            await self._until.wait()
        raise anyio.EndOfStream

    async def aclose(self) -> None:
        pass


class FakeProcess:
    """Writes its output, then exits with ``code``; with ``hang`` it runs until signalled."""

    pid = 424242

    def __init__(self, stdout: bytes = b"", stderr: bytes = b"", code: int = 0, hang: bool = False) -> None:
        self.code = code
        self.signals: list[int] = []
        self._dead = anyio.Event()
        if not hang:
            self._dead.set()
        self._stdout = FakeStream(stdout, self._dead)
        self._stderr = FakeStream(stderr, self._dead)

    @property
    def stdout(self) -> anyio.abc.ByteReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> anyio.abc.ByteReceiveStream:
        return self._stderr

    async def wait(self) -> int:
        await self._dead.wait()
        return self.code

    def signal_group(self, signum: int) -> None:
        self.signals.append(signum)
        if not self._dead.is_set():
            self.code = -signum
            self._dead.set()

    async def aclose(self) -> None:
        pass


class FakeSpawner:
    def __init__(self, *processes: FakeProcess | OSError) -> None:
        self.processes = list(processes)
        self.calls: list[tuple[list[str], dict[str, str], str | None]] = []

    async def __call__(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None) -> ChildProcess:
        self.calls.append((list(argv), dict(env), cwd))
        item = self.processes.pop(0) if self.processes else FakeProcess(stdout=b"[]")
        if isinstance(item, OSError):
            raise item
        return item


def search_adapter(**tool: Any) -> Adapter:
    spec = {
        "input_schema": SEARCH_SCHEMA,
        "switch": "mode",
        "variants": {
            "keyword": {"argv": ["search", "--json", "-n", "{limit}", "--", "{query}"], "timeout_s": 15},
            "vector": {"argv": ["vsearch", "--json", "-n", "{limit}", "--", "{query}"], "timeout_s": 30},
            "deep": {"argv": ["query", "--json", "-n", "{limit}", "--", "{query}"], "timeout_s": 120},
        },
        "ladder": {"deep": "vector", "vector": "keyword"},
        "output": "json_array",
        **tool,
    }
    return Adapter.model_validate({"command": "qmd", "tools": {"files_search": spec}})


# --------------------------------------------------------------------------------------------------- argv rules


def test_placeholders_are_replaced_by_values_and_literals_pass_as_is() -> None:
    argv = build_argv("t", ["search", "--json", "-n", "{limit}", "--", "{query}"], {"limit": 5, "query": "a b"})
    assert argv == ["search", "--json", "-n", "5", "--", "a b"]


def test_booleans_are_lowercase_integral_floats_are_digits_objects_are_json() -> None:
    argv = build_argv("t", ["--deep={deep}", "{n}", "--x={x}", "--obj={obj}"], {
        "deep": True, "n": 10.0, "x": 0.5, "obj": {"a": [1]},
    })  # fmt: skip
    assert argv == ["--deep=true", "10", "--x=0.5", '--obj={"a":[1]}']


def test_a_list_in_an_exact_element_expands_to_several_elements() -> None:
    argv = build_argv("t", ["--tag", "{tags}", "end"], {"tags": ["a", "b c", False]})
    assert argv == ["--tag", "a", "b c", "false", "end"]


def test_an_absent_optional_argument_drops_its_flag() -> None:
    template = ["search", "-n", "{limit}", "--budget={budget}", "--", "{query}"]
    assert build_argv("t", template, {"query": "q"}) == ["search", "--", "q"]
    assert build_argv("t", template, {"query": "q", "limit": None, "budget": 3}) == ["search", "--budget=3", "--", "q"]


def test_an_empty_list_drops_its_flag_but_a_double_dash_is_never_dropped() -> None:
    assert build_argv("t", ["x", "--tag", "{tags}"], {"tags": []}) == ["x"]
    assert build_argv("t", ["x", "--", "{query}"], {}) == ["x", "--"]


def test_an_absent_argument_after_a_non_option_keeps_the_previous_element() -> None:
    assert build_argv("t", ["search", "{query}"], {}) == ["search"]


@pytest.mark.parametrize("value", ["--help", "-rf", "--index=/elsewhere"])
def test_a_value_that_would_become_an_option_is_refused_without_double_dash(value: str) -> None:
    with pytest.raises(InvalidArguments) as caught:
        build_argv("files_search", ["search", "{query}", "--json"], {"query": value})
    assert caught.value.argument == "query"
    assert caught.value.tool == "files_search"


def test_a_dash_value_after_a_flag_is_refused_too() -> None:
    with pytest.raises(InvalidArguments) as caught:
        build_argv("t", ["search", "-n", "{limit}", "--", "{query}"], {"limit": -5, "query": "q"})
    assert caught.value.argument == "limit"


def test_a_dash_value_starting_an_embedded_element_is_refused_but_one_inside_is_not() -> None:
    with pytest.raises(InvalidArguments) as caught:
        build_argv("t", ["{prefix}{name}.md"], {"prefix": "", "name": "-x"})
    assert caught.value.argument == "name"
    assert build_argv("t", ["--q={query}"], {"query": "-x"}) == ["--q=-x"]


def test_a_dash_value_after_double_dash_stays_a_value() -> None:
    assert build_argv("t", ["search", "--", "{query}", "{more}"], {"query": "--help", "more": ["-a"]}) == [
        "search", "--", "--help", "-a",
    ]  # fmt: skip


def test_a_value_with_a_nul_character_is_refused() -> None:
    with pytest.raises(InvalidArguments) as caught:
        build_argv("t", ["--", "{query}"], {"query": "a\x00b"})
    assert caught.value.argument == "query"


# --------------------------------------------------------------------------------------------------- catalog & ladder


@pytest.mark.anyio
async def test_tools_pass_their_schema_through_untouched_from_configuration() -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {"q": {"type": "string"}},
        "properties": {"query": {"$ref": "#/$defs/q"}},
        "additionalProperties": False,
    }
    backend = CliBackend("qmd", adapter({"files_search": fake_tool("echo", "--", "{query}", input_schema=schema,
                                                                   description="Find it.")}))  # fmt: skip
    [before] = backend.tools()  # known from configuration, before any check: routes keep this schema
    await backend.check()
    [tool] = backend.tools()
    assert before == tool
    assert (tool.name, tool.description, tool.input_schema) == ("files_search", "Find it.", schema)
    assert backend.kind == "adapter"
    assert backend.status.tool_count == 1


def test_the_ladder_starts_at_the_requested_variant_then_its_default_then_the_first() -> None:
    backend = CliBackend("qmd", search_adapter())
    assert backend.ladder("files_search", {"mode": "deep"}) == ("deep", "vector", "keyword")
    assert backend.ladder("files_search", {"mode": "keyword"}) == ("keyword",)
    assert backend.ladder("files_search", {}) == ("vector", "keyword")
    schema = {**SEARCH_SCHEMA, "properties": {**SEARCH_SCHEMA["properties"], "mode": {"type": "string"}}}
    assert CliBackend("qmd", search_adapter(input_schema=schema)).ladder("files_search", {}) == ("keyword",)


def test_a_tool_without_switch_has_a_single_rung_and_unknown_tools_are_refused() -> None:
    backend = CliBackend("g", adapter({"graph_query": fake_tool("echo")}))
    assert backend.ladder("graph_query", {}) == (None,)
    with pytest.raises(ToolNotFound):
        backend.ladder("nope", {})


# --------------------------------------------------------------------------------------------------- validation


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("arguments", "argument"),
    [
        ({}, "query"),
        ({"query": ""}, "query"),
        ({"query": "q", "limit": 100}, "limit"),
        ({"query": "q", "limit": "ten"}, "limit"),
        ({"query": "q", "mode": "psychic"}, "mode"),
        ({"query": "q", "rm": "-rf"}, "rm"),
    ],
)
async def test_schema_errors_name_the_argument_and_spawn_nothing(arguments: dict[str, Any], argument: str) -> None:
    spawner = FakeSpawner()
    backend = CliBackend("qmd", search_adapter(), spawn=spawner)
    with pytest.raises(InvalidArguments) as caught:
        await backend.call_tool("files_search", arguments)
    assert caught.value.argument == argument
    assert f"Invalid argument '{argument}' for tool 'files_search': " in str(caught.value)
    assert spawner.calls == []


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"query": None}, "must be a string, got null"),
        ({"query": "q", "limit": True}, "must be an integer, got boolean true"),
        ({"query": "q", "limit": "ten"}, 'must be an integer, got string "ten"'),
        ({"query": "q", "mode": "fast"}, 'must be one of "keyword", "vector", "deep"; got "fast"'),
    ],
)
async def test_a_schema_error_shows_the_value_as_the_client_wrote_it_in_json(
    arguments: dict[str, Any], message: str
) -> None:
    # jsonschema words its messages with Python's repr (None, True, 'ten'): a client that sent null would read "None".
    backend = CliBackend("qmd", search_adapter(), spawn=FakeSpawner())
    with pytest.raises(InvalidArguments) as caught:
        await backend.call_tool("files_search", arguments)
    assert caught.value.message == message


@pytest.mark.anyio
async def test_null_for_an_optional_argument_runs_the_tool_with_its_default() -> None:
    """Models often send null for what they leave out: the adapter takes it as not given."""
    spawner = FakeSpawner()
    backend = CliBackend("qmd", search_adapter(), spawn=spawner)
    await backend.call_tool("files_search", {"query": "q", "limit": None, "mode": None})
    assert spawner.calls[0][0][1:] == ["vsearch", "--json", "-n", "10", "--", "q"]


@pytest.mark.anyio
async def test_a_misspelt_required_argument_is_named_as_written_with_the_one_it_resembles() -> None:
    # "'query' is a required property" sends the caller looking for an argument it did send, misspelt.
    schema = {"type": "object", "required": ["query"], "additionalProperties": False,
              "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}  # fmt: skip
    backend = CliBackend("a", adapter({"t": fake_tool("echo", input_schema=schema)}), spawn=FakeSpawner())
    with pytest.raises(InvalidArguments) as caught:
        await backend.call_tool("t", {"qery": "x"})
    assert (caught.value.argument, caught.value.message) == ("qery", "unknown argument; did you mean 'query'?")
    with pytest.raises(InvalidArguments) as caught:  # nothing like it sent: the missing one is named
        await backend.call_tool("t", {"limit": 3})
    assert (caught.value.argument, caught.value.message) == ("query", "is required")


@pytest.mark.anyio
async def test_a_nested_schema_error_names_the_dotted_path() -> None:
    schema = {"type": "object", "properties": {"filter": {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"type": "string"}}}}}}  # fmt: skip
    backend = CliBackend("a", adapter({"t": fake_tool("echo", input_schema=schema)}), spawn=FakeSpawner())
    with pytest.raises(InvalidArguments) as caught:
        await backend.call_tool("t", {"filter": {"tags": ["ok", 3]}})
    assert caught.value.argument == "filter.tags.1"


@pytest.mark.anyio
async def test_schema_defaults_fill_missing_arguments_and_the_switch_gets_the_running_variant() -> None:
    spawner = FakeSpawner()
    backend = CliBackend("qmd", search_adapter(), spawn=spawner)
    arguments = {"query": "transport"}
    await backend.call_tool("files_search", arguments)
    await backend.call_tool("files_search", {"query": "transport", "mode": "deep"}, variant="keyword")
    assert [argv for argv, _, _ in spawner.calls] == [
        ["qmd", "vsearch", "--json", "-n", "10", "--", "transport"],
        ["qmd", "search", "--json", "-n", "10", "--", "transport"],
    ]
    assert arguments == {"query": "transport"}  # the caller's dict is not modified


@pytest.mark.anyio
async def test_an_unknown_variant_is_refused_naming_the_switch() -> None:
    backend = CliBackend("qmd", search_adapter(), spawn=FakeSpawner())
    with pytest.raises(InvalidArguments) as caught:
        await backend.call_tool("files_search", {"query": "q"}, variant="psychic")
    assert caught.value.argument == "mode"


@pytest.mark.anyio
async def test_an_invalid_input_schema_fails_the_adapter_with_a_reason() -> None:
    backend = CliBackend("a", adapter({"t": fake_tool("echo", input_schema={"type": "objekt"})}))
    status = await backend.check()
    assert status.state is BackendState.FAILED
    assert "input_schema is not a valid JSON Schema" in (status.reason or "")
    with pytest.raises(BackendUnavailable):
        await backend.call_tool("t", {})


@pytest.mark.anyio
async def test_a_placeholder_that_names_no_property_fails_the_adapter() -> None:
    schema = {"type": "object", "properties": {"query": {"type": "string"}}}
    backend = CliBackend("a", adapter({"t": fake_tool("echo", "{qeury}", input_schema=schema)}))
    status = await backend.check()
    assert status.state is BackendState.FAILED
    assert "{qeury}" in (status.reason or "")


# --------------------------------------------------------------------------------------------------- answers (fake)


async def answer(process: FakeProcess, **tool: Any) -> Any:
    spec = {"argv": ["x"], "output": "text", **tool}
    backend = CliBackend("a", Adapter.model_validate({"command": "prog", "tools": {"t": spec}}),
                         spawn=FakeSpawner(process))  # fmt: skip
    return await backend.call_tool("t", {})


@pytest.mark.anyio
async def test_json_array_output_is_sliced_from_the_first_to_the_last_bracket() -> None:
    result = await answer(FakeProcess(stdout=b'Loading...\n[{"a": 1},\n {"b": [2]}]\ntook 3 ms\n'), output="json_array")
    assert text_of(result) == '[{"a":1},{"b":[2]}]'
    assert result.structured_content == {"results": [{"a": 1}, {"b": [2]}]}
    assert not result.is_error


@pytest.mark.anyio
async def test_json_output_gives_the_object_as_structured_content() -> None:
    result = await answer(FakeProcess(stdout=b'{"nodes": 3, "label": "\xc3\xa9"}\n'), output="json")
    assert text_of(result) == '{"nodes":3,"label":"é"}'
    assert result.structured_content == {"nodes": 3, "label": "é"}


@pytest.mark.anyio
async def test_text_output_is_stdout_as_is_with_invalid_utf8_replaced() -> None:
    result = await answer(FakeProcess(stdout=b"NODE a\n  --> b \xff\n"))
    assert text_of(result) == "NODE a\n  --> b \ufffd\n"
    assert result.structured_content is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("output", "stdout", "needle"),
    [
        ("json_array", b"Error: index locked\n", "found none"),
        ("json_array", b"] oops [", "found none"),
        ("json_array", b"[1, 2,]", "expected a JSON array"),
        ("json", b"not json", "expected JSON"),
        ("json", b"", "got no output"),
    ],
)
async def test_output_that_breaks_the_promised_mode_is_a_protocol_error(
    output: str, stdout: bytes, needle: str
) -> None:
    with pytest.raises(BackendProtocolError) as caught:
        await answer(FakeProcess(stdout=stdout), output=output)
    assert needle in caught.value.reason


@pytest.mark.anyio
async def test_a_no_result_exit_code_is_an_ordinary_answer_marked_in_meta() -> None:
    result = await answer(FakeProcess(stdout=b"No matching nodes found.\n", code=4), output="json_array",
                          exit_codes={"ok": [0], "no_result": [4]})  # fmt: skip
    assert text_of(result) == "No matching nodes found.\n"
    assert result.meta == {"no_result": True}
    assert not result.is_error


@pytest.mark.anyio
async def test_an_unmapped_exit_code_is_a_backend_error_with_the_last_stderr_lines() -> None:
    stderr = b"".join(b"line %d\n" % i for i in range(20)) + b"fatal: index is corrupt\n"
    with pytest.raises(BackendError) as caught:
        await answer(FakeProcess(stderr=stderr, code=3), exit_codes={"ok": [0], "no_result": [4]})
    assert type(caught.value) is BackendError
    assert caught.value.reason.startswith("process exited with code 3: ")
    assert caught.value.reason.endswith("line 19 | fatal: index is corrupt")
    assert "line 1 |" not in caught.value.reason


@pytest.mark.anyio
async def test_a_process_killed_by_a_signal_is_named() -> None:
    with pytest.raises(BackendError, match="killed by signal SIGSEGV"):
        await answer(FakeProcess(code=-signal.SIGSEGV))


@pytest.mark.anyio
async def test_an_empty_answer_with_the_configured_warning_is_thin() -> None:
    variants = {"vector": {"argv": ["vsearch"], "thin_when": {"stderr_contains": "no embeddings"}}}
    tool = {"switch": "mode", "variants": variants, "output": "json_array", "argv": None}
    with pytest.raises(BackendThinResult) as caught:
        await answer(FakeProcess(stdout=b"[]\n", stderr=b"warning: no embeddings found; run qmd embed\n"), **tool)
    assert caught.value.reason == "empty result; stderr: warning: no embeddings found; run qmd embed"
    result = await answer(FakeProcess(stdout=b"[]\n", stderr=b"some other note\n"), **tool)
    assert result.structured_content == {"results": []}
    result = await answer(FakeProcess(stdout=b'[{"a": 1}]', stderr=b"no embeddings\n"), **tool)
    assert result.structured_content == {"results": [{"a": 1}]}


@pytest.mark.anyio
async def test_blank_output_counts_as_empty_for_thin_when() -> None:
    variants = {"v": {"argv": ["v"], "thin_when": {}}}
    with pytest.raises(BackendThinResult, match="empty result$"):
        await answer(FakeProcess(stdout=b"\n"), switch="v", variants=variants, output="json_array", argv=None,
                     input_schema={"type": "object", "properties": {"v": {"type": "string"}}})  # fmt: skip


@pytest.mark.anyio
async def test_a_missing_command_is_unavailable_and_recorded() -> None:
    backend = CliBackend("qmd", search_adapter(), spawn=FakeSpawner(FileNotFoundError(2, "No such file", "qmd")))
    with pytest.raises(BackendUnavailable) as caught:
        await backend.call_tool("files_search", {"query": "q"})
    assert caught.value.reason == "command not found: qmd"
    assert backend.status.last_error == "command not found: qmd"


@pytest.mark.anyio
async def test_a_timeout_signals_the_group_term_then_kill_and_names_the_variant() -> None:
    process = FakeProcess(hang=True)
    tool = {"switch": "mode", "argv": None, "variants": {"deep": {"argv": ["query"], "timeout_s": 0.05}},
            "input_schema": {"type": "object", "properties": {"mode": {"type": "string"}}}}  # fmt: skip
    with pytest.raises(BackendTimeout) as caught:
        await answer(process, **tool)
    assert caught.value.reason == "timed out after 0.05 s (variant deep); process group killed"
    assert process.signals == [signal.SIGTERM, signal.SIGKILL]


@pytest.mark.anyio
async def test_a_normal_exit_still_sweeps_the_group() -> None:
    process = FakeProcess(stdout=b"ok")
    await answer(process)
    assert process.signals == [signal.SIGKILL]


# --------------------------------------------------------------------------------------------------- lifetime


@pytest.mark.anyio
async def test_run_reports_ready_and_notifies_listeners() -> None:
    backend = CliBackend("a", adapter({"t": fake_tool("echo")}))
    changes: list[BackendState] = []
    backend.subscribe(lambda: changes.append(backend.status.state))
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(backend.run)
            assert backend.status.state is BackendState.READY
            assert backend.status.tool_count == 1
            tg.cancel_scope.cancel()
    assert changes == [BackendState.READY]


@pytest.mark.anyio
async def test_a_missing_command_fails_the_adapter_without_blocking_startup() -> None:
    config = Adapter.model_validate({"command": "no-such-program-4f1c", "tools": {"t": {"argv": ["x"]}}})
    backend = CliBackend("a", config)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(backend.run)
            assert (backend.status.state, backend.status.reason) == (
                BackendState.FAILED, "command not found: no-such-program-4f1c",
            )  # fmt: skip
            assert [t.name for t in backend.tools()] == ["t"]  # still known, so a route keeps its schema
            with pytest.raises(BackendUnavailable, match="command not found"):
                await backend.call_tool("t", {})
            tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_failed_adapter_is_rechecked_with_growing_waits_and_heals_when_its_program_appears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_module, "RECHECK_FIRST_S", 0.05)
    monkeypatch.setattr(cli_module, "RECHECK_MAX_S", 0.4)
    program = tmp_path / "late-program"
    backend = CliBackend("a", Adapter.model_validate({"command": str(program), "tools": {"t": {"argv": ["x"]}}}))
    checks: list[float] = []
    check = backend.check

    async def counted(*, probes: bool = True) -> BackendStatus:
        checks.append(anyio.current_time())
        return await check(probes=probes)

    monkeypatch.setattr(backend, "check", counted)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(backend.run)
            assert backend.status.state is BackendState.FAILED
            await wait_until(lambda: len(checks) >= 6)
            waits = [b - a for a, b in zip(checks, checks[1:], strict=False)][:5]
            # nominal 0.05, 0.1, 0.2, 0.4, 0.4 s, each spread by ±20 %; a loaded machine only makes them longer
            assert waits[0] >= 0.04 and waits[1] >= 0.08 and waits[2] >= 0.16 and waits[3] >= 0.32
            assert waits[4] < 0.4 * 1.2 + 0.5  # capped at RECHECK_MAX_S
            program.write_text("#!/bin/sh\nexit 0\n")
            program.chmod(0o755)
            await wait_until(lambda: backend.status.state is BackendState.READY)
            tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_command_found_only_on_the_adapters_own_path_is_ready(tmp_path: Path) -> None:
    program = tmp_path / "my-search"
    program.write_text("#!/bin/sh\necho '[]'\n")
    program.chmod(0o755)
    config = Adapter.model_validate({"command": "my-search", "env": {"PATH": str(tmp_path)}, "pass_env": [],
                                     "tools": {"t": {"argv": [], "output": "json_array"}}})  # fmt: skip
    backend = CliBackend("a", config)
    assert (await backend.check()).state is BackendState.READY


@pytest.mark.anyio
async def test_a_disabled_adapter_says_why_and_refuses_calls() -> None:
    config = adapter({"t": fake_tool("echo")}, enabled=False, disabled_reason="index being rebuilt")
    backend = CliBackend("a", config, spawn=FakeSpawner())
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(backend.run)
            status = backend.status
            assert (status.state, status.reason, status.declared) == (
                BackendState.DISABLED, "index being rebuilt", True,
            )  # fmt: skip
            assert backend.tools() == ()
            with pytest.raises(BackendUnavailable, match="disabled: index being rebuilt"):
                await backend.call_tool("t", {})
            tg.cancel_scope.cancel()


@pytest.mark.spawns
@pytest.mark.anyio
async def test_a_failing_probe_fails_the_adapter() -> None:
    config = adapter({"t": fake_tool("echo")}, probe=[FAKE_CLI, "exit", "2", "", "cannot open index"])
    status = await CliBackend("a", config).check()
    assert status.state is BackendState.FAILED
    assert status.reason is not None and "exited with code 2: cannot open index" in status.reason
    config = adapter({"t": fake_tool("echo")}, probe=[FAKE_CLI, "echo", "v1"])
    assert (await CliBackend("a", config).check()).state is BackendState.READY


# --------------------------------------------------------------------------------------------------- real processes


@pytest.mark.spawns
@pytest.mark.anyio
@pytest.mark.parametrize(
    "query",
    [
        "a; rm -rf ./x",
        "$(touch pwned)",
        "`id`",
        "--help",
        "-n 5",
        "../../etc/passwd",
        'it\'s "quoted" & piped | > redirected',
        "*.md ~ $HOME",
        "",
    ],
)
async def test_injection_attempts_reach_the_program_as_one_plain_value(query: str) -> None:
    schema = {"type": "object", "properties": {"query": {"type": "string"}, "path": {"type": "string"}}}
    tool = fake_tool("echo", "--", "{query}", "{path}", input_schema=schema, output="json_array")
    backend = CliBackend("a", adapter({"t": tool}))
    with anyio.fail_after(10):
        result = await backend.call_tool("t", {"query": query, "path": "../../etc/passwd"})
    assert result.structured_content == {"results": ["--", query, "../../etc/passwd"]}


@pytest.mark.anyio
async def test_a_dash_query_without_double_dash_is_refused_before_any_spawn() -> None:
    tool = fake_tool("echo", "{query}", input_schema={"type": "object", "properties": {"query": {"type": "string"}}})
    backend = CliBackend("a", adapter({"t": tool}))
    with pytest.raises(InvalidArguments) as caught:
        await backend.call_tool("t", {"query": "--help"})
    assert caught.value.argument == "query"
    assert backend.statistics().spawned_total == 0


@pytest.mark.spawns
@pytest.mark.anyio
async def test_an_optional_argument_left_out_drops_its_flag_on_the_real_command_line() -> None:
    schema = {"type": "object", "properties": {"limit": {"type": "integer"}, "query": {"type": "string"}}}
    tool = fake_tool("echo", "-n", "{limit}", "--", "{query}", input_schema=schema, output="json_array")
    backend = CliBackend("a", adapter({"t": tool}))
    with anyio.fail_after(10):
        without = await backend.call_tool("t", {"query": "q"})
        with_limit = await backend.call_tool("t", {"query": "q", "limit": 3})
    assert without.structured_content == {"results": ["--", "q"]}
    assert with_limit.structured_content == {"results": ["-n", "3", "--", "q"]}


@pytest.mark.spawns
@pytest.mark.anyio
async def test_garbage_around_the_json_array_is_ignored() -> None:
    backend = CliBackend("a", adapter({"t": fake_tool("garbage", output="json_array")}))
    with anyio.fail_after(10):
        result = await backend.call_tool("t", {})
    assert text_of(result) == '[{"file":"a.md","score":1.5},{"file":"b.md","score":0.5}]'


@pytest.mark.spawns
@pytest.mark.anyio
async def test_exit_codes_map_to_answers_and_errors() -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string"}}}
    tool = fake_tool("exit", "{code}", "No matching nodes found.", "boom", input_schema=schema,
                     exit_codes={"ok": [0], "no_result": [4]})  # fmt: skip
    backend = CliBackend("graphify", adapter({"graph_query": tool}))
    with anyio.fail_after(10):
        ok = await backend.call_tool("graph_query", {"code": "0"})
        none = await backend.call_tool("graph_query", {"code": "4"})
        with pytest.raises(BackendError) as caught:
            await backend.call_tool("graph_query", {"code": "1"})
    assert (text_of(ok), ok.meta) == ("No matching nodes found.", None)
    assert (text_of(none), none.meta, none.is_error) == ("No matching nodes found.", {"no_result": True}, False)
    assert caught.value.reason == "process exited with code 1: boom"
    assert caught.value.backend == "graphify"


@pytest.mark.spawns
@pytest.mark.anyio
async def test_a_real_thin_answer_raises_thin_result() -> None:
    variants = {"vector": {"argv": [FAKE_CLI, "thin", "Warning: no embeddings. Run qmd embed."],
                           "thin_when": {"stderr_contains": "no embeddings"}}}  # fmt: skip
    tool = {"switch": "mode", "variants": variants, "output": "json_array",
            "input_schema": {"type": "object", "properties": {"mode": {"type": "string"}}}}  # fmt: skip
    backend = CliBackend("qmd", adapter({"files_search": tool}))
    with anyio.fail_after(10), pytest.raises(BackendThinResult, match="no embeddings"):
        await backend.call_tool("files_search", {})


@pytest.mark.spawns
@pytest.mark.anyio
async def test_every_rung_times_out_at_its_own_timeout() -> None:
    sleep = [FAKE_CLI, "sleep"]
    tool = {
        "input_schema": {"type": "object", "properties": {"mode": {"type": "string"}}},
        "switch": "mode",
        "timeout_s": 0.4,
        "variants": {
            "deep": {"argv": sleep, "timeout_s": 0.9},
            "vector": {"argv": sleep, "timeout_s": 0.6},
            "keyword": {"argv": sleep},  # no timeout of its own: the tool's
        },
        "ladder": {"deep": "vector", "vector": "keyword"},
    }
    backend = CliBackend("qmd", adapter({"files_search": tool}))
    rungs = backend.ladder("files_search", {"mode": "deep"})
    assert rungs == ("deep", "vector", "keyword")
    for rung, limit in zip(rungs, (0.9, 0.6, 0.4), strict=True):
        started = time.monotonic()
        with anyio.fail_after(10), pytest.raises(BackendTimeout) as caught:
            await backend.call_tool("files_search", {"mode": "deep"}, variant=rung)
        elapsed = time.monotonic() - started
        assert caught.value.reason == f"timed out after {limit:g} s (variant {rung}); process group killed"
        assert limit <= elapsed < limit + 3.0
    assert backend.statistics().live_processes == 0


@needs_proc
@pytest.mark.anyio
async def test_a_hung_program_is_killed_with_its_whole_group_on_timeout(pidfile: Path) -> None:
    tool = fake_tool("grandchild", str(pidfile), timeout_s=3)
    backend = CliBackend("qmd", adapter({"t": tool}))
    with anyio.fail_after(15), pytest.raises(BackendTimeout, match=r"timed out after 3 s; process group killed"):
        await backend.call_tool("t", {})
    leader, grandchild = read_pids(pidfile)
    await wait_until(lambda: not alive(grandchild))  # it ignores SIGTERM: only the group SIGKILL ends it
    assert not alive(leader)
    assert group_members(leader) == []


@needs_proc
@pytest.mark.anyio
async def test_a_grandchild_left_behind_by_a_clean_exit_is_swept(pidfile: Path) -> None:
    backend = CliBackend("qmd", adapter({"t": fake_tool("orphan", str(pidfile), output="json_array")}))
    with anyio.fail_after(10):
        result = await backend.call_tool("t", {})
    assert result.structured_content == {"results": []}
    leader, grandchild = read_pids(pidfile)
    await wait_until(lambda: not alive(grandchild))
    assert group_members(leader) == []


@needs_proc
@pytest.mark.anyio
async def test_cancelling_the_caller_kills_the_group(pidfile: Path) -> None:
    backend = CliBackend("qmd", adapter({"t": fake_tool("grandchild", str(pidfile), timeout_s=60)}))
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(backend.call_tool, "t", {})
            await wait_until(pidfile.exists)
            tg.cancel_scope.cancel()
    leader, grandchild = read_pids(pidfile)
    await wait_until(lambda: not alive(grandchild))
    assert group_members(leader) == []
    assert backend.statistics().live_processes == 0


@needs_proc
@pytest.mark.anyio
async def test_gateway_shutdown_kills_running_groups_and_refuses_new_calls(pidfile: Path) -> None:
    backend = CliBackend("qmd", adapter({"t": fake_tool("grandchild", str(pidfile), timeout_s=60)}))
    errors: list[BaseException] = []

    async def call() -> None:
        try:
            await backend.call_tool("t", {})
        except BackendUnavailable as exc:
            errors.append(exc)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as calls:
            calls.start_soon(call)
            async with anyio.create_task_group() as runtime:
                await runtime.start(backend.run)
                await wait_until(pidfile.exists)
                runtime.cancel_scope.cancel()  # the gateway shuts the backend down; the call's task lives on
    assert [str(e) for e in errors] == ["backend 'qmd': the gateway is shutting down; process group killed"]
    leader, grandchild = read_pids(pidfile)
    await wait_until(lambda: not alive(grandchild))
    assert group_members(leader) == []
    with pytest.raises(BackendUnavailable, match="shutting down"):
        await backend.call_tool("t", {})


@pytest.mark.spawns
@pytest.mark.anyio
async def test_output_over_the_cap_kills_the_group_and_exactly_the_cap_passes() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "string"}}}
    backend = CliBackend("a", adapter({"t": fake_tool("bytes", "{n}", input_schema=schema)}, max_output_bytes=100_000))
    with anyio.fail_after(10):
        at_cap = await backend.call_tool("t", {"n": "100000"})
        with pytest.raises(BackendError) as caught:
            await backend.call_tool("t", {"n": "5000000"})
    assert len(text_of(at_cap)) == 100_000
    assert caught.value.reason == "output exceeded 100000 bytes; process group killed"
    assert backend.statistics().live_processes == 0


@pytest.mark.spawns
@pytest.mark.anyio
async def test_stderr_keeps_only_its_last_bytes() -> None:
    schema = {"type": "object", "properties": {"err": {"type": "string"}}}
    tool = fake_tool("exit", "1", "", "{err}", input_schema=schema)
    backend = CliBackend("a", adapter({"t": tool}, max_stderr_bytes=64))
    with anyio.fail_after(10), pytest.raises(BackendError) as caught:
        await backend.call_tool("t", {"err": "early noise " * 1000 + "\nthe real cause"})
    assert caught.value.reason.endswith("the real cause")
    kept = caught.value.reason.removeprefix("process exited with code 1: ")
    assert len(kept.replace(" | ", "\n")) <= 64  # the last 64 bytes, lines joined


@pytest.mark.spawns
@pytest.mark.anyio
async def test_at_most_concurrency_programs_run_at_once(tmp_path: Path) -> None:
    backend = CliBackend("a", adapter({"t": fake_tool("gate", str(tmp_path), output="json_array", timeout_s=30)},
                                      concurrency=2))  # fmt: skip
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(backend.call_tool, "t", {})
            await wait_until(lambda: count(tmp_path, "seen-*") == 2 and backend.statistics().waiting_calls == 3)
            stats = backend.statistics()
            assert (stats.running_calls, stats.live_processes, stats.waiting_calls) == (2, 2, 3)
            assert count(tmp_path, "live-*") == 2
            await anyio.Path(tmp_path / "release").touch()
    seen = [int(await p.read_text()) async for p in anyio.Path(tmp_path).glob("seen-*")]
    assert len(seen) == 5
    assert max(seen) == 2
    assert backend.statistics().spawned_total == 5


@pytest.mark.spawns
@pytest.mark.anyio
async def test_waiting_for_a_slot_counts_toward_the_timeout(tmp_path: Path) -> None:
    config = adapter({"slow": fake_tool("sleep", timeout_s=60), "fast": fake_tool("echo", timeout_s=0.3)},
                     concurrency=1)  # fmt: skip
    backend = CliBackend("a", config)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(backend.call_tool, "slow", {})
            await wait_until(lambda: backend.statistics().live_processes == 1)
            with pytest.raises(BackendTimeout) as caught:
                await backend.call_tool("fast", {})
            tg.cancel_scope.cancel()
    assert caught.value.reason == "timed out after 0.3 s waiting for a free slot (all 1 slots busy)"


@pytest.mark.spawns
@pytest.mark.anyio
async def test_only_the_allow_listed_environment_reaches_the_program(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_TOKENS", "secret-token")
    monkeypatch.setenv("LANG", "C.UTF-8")
    config = adapter({"t": fake_tool("env", output="json")}, env={"XDG_CACHE_HOME": "./.cache"}, pass_env=["LANG"])
    backend = CliBackend("a", config)
    with anyio.fail_after(10):
        result = await backend.call_tool("t", {})
    env = result.structured_content
    assert "GATEWAY_TOKENS" not in env
    assert env["XDG_CACHE_HOME"] == "./.cache"
    assert env["LANG"] == "C.UTF-8"
    assert set(env) <= {"XDG_CACHE_HOME", "LANG", "LC_CTYPE", "PYTHONIOENCODING"}  # the interpreter may add LC_CTYPE


@pytest.mark.spawns
@pytest.mark.anyio
async def test_the_program_runs_in_the_configured_folder_with_an_empty_stdin(tmp_path: Path) -> None:
    config = adapter({"cwd": fake_tool("cwd", output="json"), "stdin": fake_tool("stdin", output="json")},
                     cwd=str(tmp_path))  # fmt: skip
    backend = CliBackend("a", config)
    with anyio.fail_after(10):
        cwd = await backend.call_tool("cwd", {})
        stdin = await backend.call_tool("stdin", {})
    assert same_folder(cwd.structured_content["cwd"], tmp_path)
    assert stdin.structured_content == {"stdin": ""}


@pytest.mark.spawns
@pytest.mark.anyio
async def test_a_real_missing_command_is_unavailable() -> None:
    config = Adapter.model_validate({"command": "no-such-program-4f1c", "tools": {"t": {"argv": ["x"]}}})
    with anyio.fail_after(10), pytest.raises(BackendUnavailable) as caught:
        await CliBackend("qmd", config).call_tool("t", {})
    assert caught.value.reason == "command not found: no-such-program-4f1c"
