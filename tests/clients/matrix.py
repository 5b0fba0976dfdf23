"""The client matrix: each real MCP client, pinned in its own tree under ``.tools/clients`` (scripts/install-clients),
driven against a served gateway as its users drive it, and what it shows its user or its model.

A *run* is one client against one target (``Scenario``): HTTP with a static bearer token, with an access token from
the real OpenID provider, with no token or a wrong one, or the gateway spawned over stdio. It yields a ``Run``: did it
connect, which tools it listed (as the client names them), what the model reads for each scripted call, and what it
said when it failed. The cells (``CHECKS``) are judged on runs in test_matrix.py; ``EXPECTED`` holds the cells known
to fail, each with the issue-23 item that fixes it or the client-side limit that explains it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.clients.standin import ModelStandin

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools"
CLIENTS = TOOLS / "clients"
DRIVERS = Path(__file__).with_name("drivers")

CALL_TEXT = "hello from the client matrix"
SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("echo", {"text": CALL_TEXT}),  # call: an echo server's tool behind the gateway
    ("wiki_search", {"query": "matrix", "limit": 0}),  # a wrong argument: the gateway's own wiki refuses it
]
TOOLS_LISTED = ("echo", "add", "wiki_search")
RUN_TIMEOUT_S = 60.0
"""A client run's bound (a CLI's whole conversation with the stand-in, or a driver's connect and calls)."""
REFUSED_TIMEOUT_S = 30.0
"""How long a client may take to give up on a refused connection: a client still waiting then has hung."""


@dataclass(frozen=True)
class Scenario:
    """What one run connects to. ``target`` is ``{"url", "headers"}`` (HTTP) or ``{"command", "args", "env"}``
    (the gateway over stdio); ``script`` is empty for the refused runs (no token, a wrong token)."""

    transport: str
    auth: str
    target: Mapping[str, Any]
    script: list[tuple[str, dict[str, Any]]]
    folder: Path

    @property
    def timeout(self) -> float:
        return RUN_TIMEOUT_S if self.script else REFUSED_TIMEOUT_S


@dataclass
class Run:
    version: str
    connected: bool
    tools: list[str] | None
    readings: list[dict[str, Any]]
    error: str | None
    timed_out: bool
    seconds: float
    output: str = ""
    """Everything the client printed, for the failure messages."""

    def describe(self) -> str:
        shown = {key: value for key, value in self.__dict__.items() if key != "output"}
        return f"{json.dumps(shown, indent=1)}\n--- client output ---\n{self.output[-4000:]}"


@dataclass(frozen=True)
class Client:
    key: str
    name: str
    transports: tuple[str, ...]
    run: Callable[[Client, Scenario], Run]
    package: str
    """Where its version is read: an npm package under its tree, or a PyPI distribution in its venv."""
    limits: tuple[str, ...] = ()
    """Known client-side limits, as docs/clients.md states them."""
    refusal_words: str = r"401|unauthori[sz]ed|bearer token"
    """What its user must see when the gateway refuses the token: the reason, in the server's words or its own."""

    def version(self) -> str:
        for tree in (CLIENTS / self.key, TOOLS / "npm"):  # the Inspector comes with the test tools (tools/npm)
            npm = tree / "node_modules" / self.package / "package.json"
            if npm.is_file():
                return str(json.loads(npm.read_text())["version"])
        for base in (CLIENTS / self.key / "venv", TOOLS / "venvs" / self.key):
            for meta in base.glob(f"lib/python*/site-packages/{self.package.replace('-', '_')}-*.dist-info/METADATA"):
                found = re.search(r"^Version: (.+)$", meta.read_text(), re.MULTILINE)
                if found:
                    return found.group(1).strip()
        return "not installed"

    def pinned(self) -> str:
        """The version its pins in tools/ name (tools/clients/KEY, or the test tools' tools/npm and tools/python)."""
        for manifest in (
            ROOT / "tools" / "clients" / self.key / "package.json",
            ROOT / "tools" / "npm" / "package.json",
        ):
            if manifest.is_file():
                found = json.loads(manifest.read_text()).get("dependencies", {}).get(self.package)
                if found is not None:
                    return str(found)
        for lock in (
            ROOT / "tools" / "clients" / self.key / "requirements.txt",
            ROOT / "tools" / "python" / f"{self.key}.txt",
        ):
            if lock.is_file():
                found = re.search(
                    rf"^{re.escape(self.package)}==(\S+)$", lock.read_text(), re.MULTILINE | re.IGNORECASE
                )
                if found:
                    return found.group(1)
        raise LookupError(f"no pin of {self.package} under tools/")

    def installed(self) -> bool:
        return self.version() != "not installed"


def _env(folder: Path, **extra: str) -> dict[str, str]:
    """A client's environment: its own HOME (no state of the machine's user), Node 22 and the tools first on PATH."""
    home = folder / "home"
    home.mkdir(exist_ok=True)
    return {
        "PATH": f"{TOOLS / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
        **extra,
    }


def _exec(
    argv: list[str], env: Mapping[str, str], cwd: Path, timeout: float, *, apart: bool = False
) -> tuple[int | None, str]:
    """Run a client command: its exit code (None when it had to be killed at ``timeout``) and its stdout and stderr
    (``apart``: stdout only, stderr appended after a marker line, since a stdio server's log goes to stderr)."""
    with subprocess.Popen(
        argv,
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if apart else subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as process:
        code: int | None
        try:
            out, err = process.communicate(timeout=timeout)
            code = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            out, err = process.communicate()
            code = None
    return code, out + (f"\n{STDERR_MARK}\n{err}" if err else "")


STDERR_MARK = "--- stderr ---"


# ------------------------------------------------------------------------------------------ Python drivers


def _python_run(python: Path, driver: str, **pinned: str) -> Callable[[Client, Scenario], Run]:
    def run(client: Client, scenario: Scenario) -> Run:
        document = {"target": scenario.target, "script": scenario.script, "timeout": scenario.timeout, **pinned}
        argv = [str(python), str(DRIVERS / driver), json.dumps(document)]
        code, out = _exec(argv, _env(scenario.folder), scenario.folder, scenario.timeout + 15)
        for line in reversed(out.splitlines()):
            if line.startswith("MATRIX-REPORT "):
                report = json.loads(line.removeprefix("MATRIX-REPORT "))
                return Run(**report, output=out)
        error = f"the driver gave no report (exit {code})" if code is not None else "the driver had to be killed"
        return Run(client.version(), False, None, [], error, code is None, scenario.timeout, out)

    return run


def _venv(key: str) -> Path:
    return CLIENTS / key / "venv" / "bin" / "python"


def _mcp_remote(client: Client, scenario: Scenario) -> Run:
    """mcp-remote is the stdio server its host spawns: the gateway's SDK speaks stdio to it, it speaks HTTP on."""
    headers = dict(scenario.target.get("headers") or {})
    args = [scenario.target["url"]]
    env = _env(scenario.folder, MCP_REMOTE_CONFIG_DIR=str(scenario.folder / "mcp-auth"))
    if "Authorization" in headers:  # as its README says: the value in an env var, no space in the argument
        args += ["--header", "Authorization:${AUTH_HEADER}"]
        env["AUTH_HEADER"] = headers["Authorization"]
    bridge = {"command": str(CLIENTS / "mcp-remote" / "node_modules" / ".bin" / "mcp-remote"), "args": args, "env": env}
    inner = Scenario(scenario.transport, scenario.auth, bridge, scenario.script, scenario.folder)
    return _python_run(Path(sys.executable), "drive_sdk_stdio.py", version=client.version())(client, inner)


# --------------------------------------------------------------------------------------------- the CLIs


def _inspector(client: Client, scenario: Scenario) -> Run:
    """The Inspector CLI: one process per method, as a script using it runs it."""
    target = scenario.target
    if "url" in target:
        head = [target["url"]]
        for name, value in (target.get("headers") or {}).items():
            head += ["--header", f"{name}: {value}"]
    else:
        head = [target["command"], *target["args"]]
        for name, value in target["env"].items():
            head += ["-e", f"{name}={value}"]
    env = _env(scenario.folder, MCP_CATALOG_PATH=str(scenario.folder / "catalog.json"))
    base = [str(TOOLS / "bin" / "mcp-inspector"), "--cli", *head, "--format", "json"]
    outputs: list[str] = []

    def ask(*method: str) -> tuple[int | None, Any]:
        code, out = _exec([*base, *method], env, scenario.folder, scenario.timeout, apart=True)
        outputs.append(out)
        stdout = out.split(STDERR_MARK)[0]
        try:
            return code, json.loads(stdout[stdout.index("{") :])
        except ValueError:
            return code, out

    run = Run(client.version(), False, None, [], None, False, 0.0)
    code, listed = ask("--method", "tools/list")
    if code != 0 or not isinstance(listed, dict) or "result" not in listed:
        run.error, run.timed_out = json.dumps(listed) if not isinstance(listed, str) else listed, code is None
    else:
        run.connected, run.tools = True, [tool["name"] for tool in listed["result"]["tools"]]
        for name, arguments in scenario.script:
            code, answer = ask("--method", "tools/call", "--tool-name", name, "--tool-args-json", json.dumps(arguments))
            result = answer.get("result", {}) if isinstance(answer, dict) else {}
            text = "\n".join(block.get("text", "") for block in result.get("content", [])) or json.dumps(answer)
            run.readings.append({"tool": name, "text": text, "error": bool(result.get("isError", True))})
    run.output = "\n".join(outputs)
    return run


def _claude_code(client: Client, scenario: Scenario) -> Run:
    """Claude Code: ``claude mcp add-json`` and ``claude mcp list`` (its health check, which names a failure), then a
    headless ``claude -p`` whose model is the stand-in: its tool calls go through Claude Code's MCP stack."""
    binary = str(CLIENTS / "claude-code" / "node_modules" / ".bin" / "claude")
    target = scenario.target
    entry: dict[str, Any] = (
        {"type": "http", "url": target["url"], "headers": dict(target.get("headers") or {})}
        if "url" in target
        else {"type": "stdio", "command": target["command"], "args": target["args"], "env": target["env"]}
    )
    folder = scenario.folder
    with ModelStandin(scenario.script) as model:
        env = _env(
            folder,
            ANTHROPIC_BASE_URL=model.url,
            ANTHROPIC_API_KEY="sk-standin",
            ENABLE_TOOL_SEARCH="false",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            DISABLE_AUTOUPDATER="1",
        )
        outputs = []
        code, out = _exec([binary, "mcp", "add-json", "gw", json.dumps(entry)], env, folder, scenario.timeout)
        outputs.append(out)
        code, out = _exec([binary, "mcp", "list"], env, folder, scenario.timeout)
        outputs.append(out)
        status = next((line for line in out.splitlines() if line.startswith("gw:")), out)
        run = Run(client.version(), "Connected" in status, None, [], None, code is None, 0.0)
        if not run.connected:
            run.error = status
        elif scenario.script:
            config = folder / "mcp.json"
            config.write_text(json.dumps({"mcpServers": {"gw": entry}}))
            argv = [binary, "-p", "use the tools", "--mcp-config", str(config), "--strict-mcp-config"]
            argv += ["--allowedTools", "mcp__gw", "--output-format", "json"]
            code, out = _exec(argv, env, folder, scenario.timeout)
            outputs.append(out)
            run.timed_out = code is None
            _read_standin(run, model, "mcp__gw__")
    run.output = "\n".join(outputs)
    return run


def _gemini_cli(client: Client, scenario: Scenario) -> Run:
    """Gemini CLI: ``settings.json`` as its users write it, ``gemini mcp list`` (its health check), then a headless
    ``gemini -p`` whose model API is the stand-in."""
    binary = str(CLIENTS / "gemini-cli" / "node_modules" / ".bin" / "gemini")
    target = scenario.target
    server: dict[str, Any] = (
        {"httpUrl": target["url"], "headers": dict(target.get("headers") or {})}
        if "url" in target
        else {"command": target["command"], "args": target["args"], "env": target["env"]}
    )
    server |= {"trust": True, "timeout": int(scenario.timeout * 1000)}
    folder = scenario.folder
    work = folder / "work"
    work.mkdir(exist_ok=True)
    with ModelStandin(scenario.script) as model:
        env = _env(folder, GOOGLE_GEMINI_BASE_URL=model.url, GEMINI_API_KEY="standin", GEMINI_CLI_NO_RELAUNCH="true")
        settings = Path(env["HOME"]) / ".gemini"
        settings.mkdir(exist_ok=True)
        (settings / "settings.json").write_text(
            json.dumps(
                {
                    "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
                    "mcpServers": {"gw": server},
                    "privacy": {"usageStatisticsEnabled": False},
                    "telemetry": {"enabled": False},
                }
            )
        )
        outputs = []
        code, out = _exec([binary, "mcp", "list"], env, work, scenario.timeout)
        outputs.append(out)
        status = next((line for line in out.splitlines() if "gw:" in line), out)
        run = Run(client.version(), "Connected" in status and "Disconnected" not in status, None, [], None, False, 0.0)
        run.timed_out = code is None
        if not run.connected:
            run.error = status
        elif scenario.script:
            argv = [binary, "-p", "use the tools", "--approval-mode", "yolo", "-o", "json"]
            code, out = _exec(argv, env, work, scenario.timeout)
            outputs.append(out)
            run.timed_out = code is None
            _read_standin(run, model, "mcp_gw_")
    run.output = "\n".join(outputs)
    return run


def _read_standin(run: Run, model: ModelStandin, prefix: str) -> None:
    """What the stand-in saw: the MCP tools the CLI declared to the model, and what it read back for each call."""
    declared = model.declared[0] if model.declared else []
    run.tools = [name.removeprefix(prefix) for name in declared if name.startswith(prefix)] or None
    run.readings = [{"tool": r.tool.removeprefix(prefix), "text": r.text, "error": r.error} for r in model.results]


# ------------------------------------------------------------------------------------------ the clients

FASTMCP_PYTHON = TOOLS / "venvs" / "fastmcp" / "bin" / "python"

CLIENTS_UNDER_TEST: tuple[Client, ...] = (
    Client(
        "claude-code",
        "Claude Code",
        ("http", "stdio"),
        _claude_code,
        "@anthropic-ai/claude-code",
        limits=("gives the model `structuredContent` when present, else the text; never `_meta`",),
    ),
    Client(
        "gemini-cli",
        "Gemini CLI",
        ("http", "stdio"),
        _gemini_cli,
        "@google/gemini-cli",
        limits=(
            "checks arguments against the tool's schema itself: the model reads its message, not the gateway's",
            "gives the model the text wrapped in `<untrusted_context>`",
        ),
    ),
    Client("mcp-remote", "mcp-remote", ("http",), _mcp_remote, "mcp-remote"),
    Client("inspector", "MCP Inspector CLI", ("http", "stdio"), _inspector, "@modelcontextprotocol/inspector"),
    Client(
        "openai-agents",
        "openai-agents",
        ("http", "stdio"),
        _python_run(_venv("openai-agents"), "drive_openai_agents.py"),
        "openai-agents",
        limits=("gives the model the text (or the structured result when asked), with no error flag",),
    ),
    Client(
        "langchain",
        "langchain-mcp-adapters",
        ("http", "stdio"),
        _python_run(_venv("langchain"), "drive_langchain.py"),
        "langchain-mcp-adapters",
        limits=(
            "pins `mcp<2`: speaks the 2025 protocol eras only",
            "an `isError` result reaches the model as an ordinary answer (no `ToolException`)",
        ),
    ),
    Client(
        "fastmcp",
        "fastmcp Client",
        ("http", "stdio"),
        _python_run(FASTMCP_PYTHON, "drive_fastmcp.py"),
        "fastmcp",
    ),
    Client(
        "pydantic-ai",
        "pydantic-ai",
        ("http", "stdio"),
        _python_run(_venv("pydantic-ai"), "drive_pydantic_ai.py"),
        "pydantic-ai-slim",
        limits=(
            "`MCPToolset` gives up on a stdio server that has not answered `initialize` within 5 s (`init_timeout`);"
            " the gateway's stdio start took 3.7-5.7 s on a loaded 2-core machine: pass `init_timeout=30`",
            'an `isError` result may reach the model as a tool return (`{"error": ...}`), not as a retry prompt',
        ),
    ),
    Client(
        "mcp-use",
        "mcp-use",
        ("http", "stdio"),
        _python_run(_venv("mcp-use"), "drive_mcp_use.py"),
        "mcp-use",
        limits=(
            "pins `mcp<2`: speaks the 2025 protocol eras only",
            "a token belongs in `auth`: with only an `Authorization` header it starts its own OAuth flow against a"
            " server that publishes OAuth metadata",
        ),
    ),
)
BY_KEY = {client.key: client for client in CLIENTS_UNDER_TEST}


# -------------------------------------------------------------------------------------------- the cells


@dataclass(frozen=True)
class Check:
    key: str
    title: str
    auth: str
    """The run it is judged on: bearer, oauth, none (no token), wrong (a wrong token), stdio (no auth)."""
    judge: Callable[[Client, Run], str | None] = field(repr=False)
    """None when the cell holds, else a sentence saying what the client showed instead."""


def _connects(client: Client, run: Run) -> str | None:
    if run.connected and run.error is None:
        return None
    return f"did not connect: {run.error or 'no error given'}"


def _lists(client: Client, run: Run) -> str | None:
    names = run.tools or []
    missing = [tool for tool in TOOLS_LISTED if not any(name == tool or name.endswith(tool) for name in names)]
    return f"listed {names}, missing {missing}" if missing or not run.connected else None


def _calls(client: Client, run: Run) -> str | None:
    reading = run.readings[0] if run.readings else None
    if reading is None:
        return f"the model read nothing for the call ({run.error or 'no error'})"
    if CALL_TEXT not in reading["text"] or reading["error"]:
        return f"the model read {reading!r}"
    return None


def _refuses_argument(client: Client, run: Run) -> str | None:
    reading = run.readings[1] if len(run.readings) > 1 else None
    if reading is None:
        return f"the model read nothing for the wrong argument ({run.error or 'no error'})"
    if "limit" not in reading["text"] or CALL_TEXT in reading["text"]:
        return f"the model read {reading!r}, not an error naming 'limit'"
    return None


def _refused(client: Client, run: Run) -> str | None:
    if run.connected and run.error is None:
        return "connected without a valid token"
    if run.timed_out:
        return f"still waiting after {REFUSED_TIMEOUT_S:.0f} s (it hangs)"
    if not re.search(client.refusal_words, run.error or "", re.IGNORECASE):
        return f"its user is not told why: {run.error!r}"
    return None


CHECKS: tuple[Check, ...] = (
    Check("connect", "connects", "bearer", _connects),
    Check("list", "lists", "bearer", _lists),
    Check("call", "calls", "bearer", _calls),
    Check("wrong_argument", "a wrong argument", "bearer", _refuses_argument),
    Check("oauth", "an OpenID provider's token", "oauth", lambda c, r: _connects(c, r) or _lists(c, r) or _calls(c, r)),
    Check("no_token", "no token", "none", _refused),
    Check("wrong_token", "a wrong token", "wrong", _refused),
)
STDIO_CHECKS = ("connect", "list", "call", "wrong_argument")


@dataclass(frozen=True)
class Expected:
    """A cell known to fail: ``item`` is the issue-23 item whose fix makes it pass (a gateway defect), else it is
    a limit of the client (``why`` says which)."""

    why: str
    item: int | None = None


_HANGS = Expected("after the 401 it walks OAuth discovery, which the gateway answers 401, and waits for a sign-in", 5)
_ASKS = Expected("after the 401 it walks OAuth discovery, which the gateway answers 401, and asks for a sign-in", 5)
_NO_REASON = Expected("the 401 body is not a JSON-RPC error, so mcp 2.x shows 'Server returned an error response'", 4)
_SILENT = Expected(
    "a refused token shows as `Disconnected` in `gemini mcp list` and not at all in a session, never why"
)
EXPECTED: dict[tuple[str, str, str], Expected] = {
    ("gemini-cli", "http", "no_token"): _SILENT,
    ("gemini-cli", "http", "wrong_token"): _SILENT,
    ("mcp-remote", "http", "no_token"): _HANGS,
    ("mcp-remote", "http", "wrong_token"): _HANGS,
    ("inspector", "http", "no_token"): _ASKS,
    ("inspector", "http", "wrong_token"): _ASKS,
    **{
        (client, "http", check): _NO_REASON
        for client in ("openai-agents", "fastmcp", "pydantic-ai")
        for check in ("no_token", "wrong_token")
    },
}
"""(client, transport, check) -> why that cell fails today, as the matrix measured it (issue 23's items)."""
