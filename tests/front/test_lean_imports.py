"""A gateway loads the search engine only when it searches: without a wiki and without search exposure, serving a
list and a call (whose answer's tokens are counted) never imports numpy or the ranking modules (about 11 MB of
resident memory and a tenth of a second of start-up). A gateway in a process of its own (imports are per process),
in front of a real stdio server (tests/fixtures/echo_server.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.fixtures.gateway_proc import FIXTURES

pytestmark = pytest.mark.spawns

_SERVED = textwrap.dedent(
    """
    import json, sys
    import anyio
    from gateway.testing import in_process_gateway

    CONFIG = '''
    servers:
      echo: {transport: stdio, command: %(python)s, args: [%(echo)s, --stdio]}
    %(extra)s
    '''

    async def main() -> None:
        with anyio.fail_after(60):
            async with in_process_gateway(CONFIG) as running:
                tools = [tool.name for tool in (await running.client.list_tools()).tools]
                done = await running.client.call_tool(%(tool)s, %(arguments)s)
        print(json.dumps({"tools": tools, "error": done.is_error,
                          "loaded": sorted(m for m in sys.modules if m == "numpy" or m.startswith("gateway.search"))}))

    anyio.run(main)
    """
)


def _served(extra: str = "", tool: str = "echo", arguments: str = '{"text": "hi"}') -> dict[str, object]:
    script = _SERVED % {
        "python": json.dumps(sys.executable),
        "echo": json.dumps(str(FIXTURES / "echo_server.py")),
        "extra": extra,
        "tool": json.dumps(tool),
        "arguments": arguments,
    }
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    answer: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return answer


def test_a_gateway_without_wiki_or_search_never_loads_the_search_engine() -> None:
    served = _served()
    assert "echo" in served["tools"] and served["error"] is False
    assert served["loaded"] == ["gateway.search", "gateway.search.packages", "gateway.search.tokens"]


def test_a_search_loads_it() -> None:
    served = _served("exposure: {mode: search}", "find_tools", '{"query": "echo a text back"}')
    assert served["tools"] == ["find_tools", "call_tool"] and served["error"] is False
    assert "numpy" in served["loaded"] and "gateway.search.tools" in served["loaded"]
