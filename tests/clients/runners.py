"""How each real client is driven: a *runner* takes the client's version and a ``Scenario`` (what to connect to,
which calls to make) and returns a ``Run`` (did it connect, the tools it listed as it names them, what the model read
for each call, what it said when it failed). The Python clients run a driver (``drivers/``) in their own venvs; the
CLIs run as their users run them, in a HOME of their own, the agent CLIs with the model stand-in (standin.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
RUN_TIMEOUT_S = 90.0
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


Runner = Callable[[str, Scenario], Run]
"""A client's runner: (its version, what to run) -> what it saw."""


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


def python_run(python: Path, driver: str, **pinned: str) -> Runner:
    def run(version: str, scenario: Scenario) -> Run:
        document = {"target": scenario.target, "script": scenario.script, "timeout": scenario.timeout, **pinned}
        argv = [str(python), str(DRIVERS / driver), json.dumps(document)]
        code, out = _exec(argv, _env(scenario.folder), scenario.folder, scenario.timeout + 15)
        for line in reversed(out.splitlines()):
            if line.startswith("MATRIX-REPORT "):
                report = json.loads(line.removeprefix("MATRIX-REPORT "))
                return Run(**report, output=out)
        error = f"the driver gave no report (exit {code})" if code is not None else "the driver had to be killed"
        return Run(version, False, None, [], error, code is None, scenario.timeout, out)

    return run


def venv(key: str) -> Path:
    return CLIENTS / key / "venv" / "bin" / "python"


def mcp_remote(version: str, scenario: Scenario) -> Run:
    """mcp-remote is the stdio server its host spawns: the gateway's SDK speaks stdio to it, it speaks HTTP on."""
    headers = dict(scenario.target.get("headers") or {})
    args = [scenario.target["url"]]
    env = _env(scenario.folder, MCP_REMOTE_CONFIG_DIR=str(scenario.folder / "mcp-auth"))
    if "Authorization" in headers:  # as its README says: the value in an env var, no space in the argument
        args += ["--header", "Authorization:${AUTH_HEADER}"]
        env["AUTH_HEADER"] = headers["Authorization"]
    bridge = {"command": str(CLIENTS / "mcp-remote" / "node_modules" / ".bin" / "mcp-remote"), "args": args, "env": env}
    inner = Scenario(scenario.transport, scenario.auth, bridge, scenario.script, scenario.folder)
    return python_run(Path(sys.executable), "drive_sdk_stdio.py", version=version)(version, inner)


# --------------------------------------------------------------------------------------------- the CLIs


def inspector(version: str, scenario: Scenario) -> Run:
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

    run = Run(version, False, None, [], None, False, 0.0)
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


def claude_code(version: str, scenario: Scenario) -> Run:
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
            # Claude Code's bound on a server's start (30 s by default): a stdio gateway on a busy machine needs more
            MCP_TIMEOUT=str(int(scenario.timeout * 1000)),
        )
        outputs = []
        code, out = _exec([binary, "mcp", "add-json", "gw", json.dumps(entry)], env, folder, scenario.timeout)
        outputs.append(out)
        code, out = _exec([binary, "mcp", "list"], env, folder, scenario.timeout)
        outputs.append(out)
        status = next((line for line in out.splitlines() if line.startswith("gw:")), out)
        run = Run(version, "Connected" in status, None, [], None, code is None, 0.0)
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


def gemini_cli(version: str, scenario: Scenario) -> Run:
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
        run = Run(version, "Connected" in status and "Disconnected" not in status, None, [], None, False, 0.0)
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
