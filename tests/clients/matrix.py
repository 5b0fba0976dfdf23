"""The client matrix: each real MCP client, pinned in its own tree under ``.tools/clients`` (scripts/install-clients),
driven against a served gateway as its users drive it, and what it shows its user or its model.

A *run* is one client against one target: HTTP with a static bearer token, with an access token from the real OpenID
provider, with no token or a wrong one, or the gateway spawned over stdio (runners.py drives each client). The cells
(``CHECKS``) are judged on runs in test_matrix.py; ``EXPECTED`` holds the cells known to fail, each with the issue-23
item that fixes it or the client-side limit that explains it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.clients.runners import (
    CALL_TEXT,
    CLIENTS,
    REFUSED_TIMEOUT_S,
    ROOT,
    SCRIPT,
    TOOLS,
    Run,
    Runner,
    Scenario,
    claude_code,
    gemini_cli,
    inspector,
    mcp_remote,
    python_run,
    venv,
)

__all__ = ["ROOT", "SCRIPT", "TOOLS", "Run", "Scenario"]  # what conftest.py and table.py take from here too

TOOLS_LISTED = ("echo", "add", "wiki_search")
REFUSAL_WORDS = r"401|unauthori[sz]ed|bearer token"
"""What a client's user must see when the gateway refuses the token: the reason, in the server's words or its own."""


@dataclass(frozen=True)
class Client:
    key: str
    name: str
    transports: tuple[str, ...]
    runner: Runner
    package: str
    """Where its version is read: an npm package under its tree, or a PyPI distribution in its venv."""
    limits: tuple[str, ...] = ()
    """Known client-side limits, as docs/clients.md states them."""

    def version(self) -> str:
        for tree in (CLIENTS / self.key, TOOLS / "npm-test"):  # the Inspector comes with the test tools
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
        """The version its pins in tools/ name (tools/clients/KEY, or the test tools' tools/npm-test and
        tools/python)."""
        for manifest in (
            ROOT / "tools" / "clients" / self.key / "package.json",
            ROOT / "tools" / "npm-test" / "package.json",
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


# ------------------------------------------------------------------------------------------ the clients

FASTMCP_PYTHON = TOOLS / "venvs" / "fastmcp" / "bin" / "python"

CLIENTS_UNDER_TEST: tuple[Client, ...] = (
    Client(
        "claude-code",
        "Claude Code",
        ("http", "stdio"),
        claude_code,
        "@anthropic-ai/claude-code",
        limits=("gives the model `structuredContent` when present, else the text; never `_meta`",),
    ),
    Client(
        "gemini-cli",
        "Gemini CLI",
        ("http", "stdio"),
        gemini_cli,
        "@google/gemini-cli",
        limits=(
            "checks arguments against the tool's schema itself: the model reads its message, not the gateway's",
            "gives the model the text wrapped in `<untrusted_context>`",
        ),
    ),
    Client("mcp-remote", "mcp-remote", ("http",), mcp_remote, "mcp-remote"),
    Client("inspector", "MCP Inspector CLI", ("http", "stdio"), inspector, "@modelcontextprotocol/inspector"),
    Client(
        "openai-agents",
        "openai-agents",
        ("http", "stdio"),
        python_run(venv("openai-agents"), "drive_openai_agents.py"),
        "openai-agents",
        limits=("gives the model the text (or the structured result when asked), with no error flag",),
    ),
    Client(
        "langchain",
        "langchain-mcp-adapters",
        ("http", "stdio"),
        python_run(venv("langchain"), "drive_langchain.py"),
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
        python_run(FASTMCP_PYTHON, "drive_fastmcp.py"),
        "fastmcp",
    ),
    Client(
        "pydantic-ai",
        "pydantic-ai",
        ("http", "stdio"),
        python_run(venv("pydantic-ai"), "drive_pydantic_ai.py"),
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
        python_run(venv("mcp-use"), "drive_mcp_use.py"),
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
    if not re.search(REFUSAL_WORDS, run.error or "", re.IGNORECASE):
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


_SILENT = Expected(
    "a refused token shows as `Disconnected` in `gemini mcp list` and not at all in a session, never why"
)
_CLOSED = Expected(
    "it fails at once (the gateway's OAuth paths answer 404) and its app is told 'Connection closed'; the gateway's "
    "reason is in mcp-remote's log"
)
_TTY = Expected("after a 401 its CLI goes to an interactive OAuth sign-in and, without a terminal, says auth_required")
EXPECTED: dict[tuple[str, str, str], Expected] = {
    ("gemini-cli", "http", "no_token"): _SILENT,
    ("gemini-cli", "http", "wrong_token"): _SILENT,
    ("mcp-remote", "http", "no_token"): _CLOSED,
    ("mcp-remote", "http", "wrong_token"): _CLOSED,
    ("inspector", "http", "no_token"): _TTY,
    ("inspector", "http", "wrong_token"): _TTY,
}
"""(client, transport, check) -> why that cell fails today, as the matrix measured it (issue 23's items)."""
