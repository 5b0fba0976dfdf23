"""Collect the tool-search benchmark's catalog: real ``tools/list`` answers of real MCP servers, installed by hand.

Each entry of ``SERVERS`` names a package (npm or PyPI), how to start it over stdio from an install folder, and the
dummy credentials or flags it needs to start offline. A *variant* is the same package started differently (another
toolset flag, a read-only switch): its tools are real answers too, but many repeat another variant's, so the
catalog records both the rows and how many distinct (package, name, description, schema) tools they hold.

Install the servers first, outside the project (their code is never committed):

    npm install --ignore-scripts --prefix SCRATCH/npm PACKAGE...        # the npm ones
    python3 -m venv SCRATCH/py/v-PACKAGE && SCRATCH/py/v-PACKAGE/bin/pip install PACKAGE   # each PyPI one

then run, from the project root:

    .venv/bin/python -m bench.collect_catalog --scratch SCRATCH [--only NAME]...

It writes ``bench/catalog/servers/<variant>.json`` (the server's tools: name, description, inputSchema,
annotations, with the package and its installed version) and ``bench/catalog/index.json`` (every variant, its tool
count, and the totals). A server that does not start or answer within ``--timeout`` seconds is reported and skipped;
an earlier run's file for it is kept.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

_HERE = Path(__file__).resolve().parent
OUT = _HERE / "catalog"


@dataclass(frozen=True)
class Server:
    variant: str  # the file name: unique per configuration
    ecosystem: str  # npm | pypi
    package: str
    bin: str  # node_modules/.bin/<bin> for npm (or a script under node_modules, run by node), v-<package>/bin/<bin>
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    note: str = ""


_DUMMY = "dummy-credential-for-tools-list"

# Tried and left out, because they do not start offline here:
#   @stripe/mcp and @apify/actors-mcp-server (no answer within a minute without their APIs),
#   @azure-devops/mcp (needs the native keytar module, not built with --ignore-scripts),
#   @supabase/mcp-server-supabase (lists tools only after reaching its API),
#   @heroku/mcp-server (imports an SDK path its pinned SDK lacks), @benborla29/mcp-server-mysql and
#   mcp-server-motherduck (exit at start), mcp-server-docker (did not install),
#   kubernetes-mcp-server (its wheel downloads the Go binary at first run).
SERVERS: tuple[Server, ...] = (
    # --- npm ---------------------------------------------------------------------------------------------------
    Server("playwright", "npm", "@playwright/mcp", "playwright-mcp", ("--headless",)),
    Server(
        "playwright-all-caps",
        "npm",
        "@playwright/mcp",
        "playwright-mcp",
        ("--headless", "--caps=vision,pdf,testing,tracing"),
        note="variant: every optional capability",
    ),
    Server("chrome-devtools", "npm", "chrome-devtools-mcp", "chrome-devtools-mcp", ("--headless",)),
    Server("filesystem", "npm", "@modelcontextprotocol/server-filesystem", "mcp-server-filesystem", ("{tmp}",)),
    Server(
        "memory",
        "npm",
        "@modelcontextprotocol/server-memory",
        "mcp-server-memory",
        (),
        {"MEMORY_FILE_PATH": "{tmp}/memory.jsonl"},
    ),  # fmt: skip
    Server("everything", "npm", "@modelcontextprotocol/server-everything", "mcp-server-everything", ("stdio",)),
    Server(
        "sequential-thinking",
        "npm",
        "@modelcontextprotocol/server-sequential-thinking",
        "mcp-server-sequential-thinking",
    ),  # fmt: skip
    Server(
        "github-reference",
        "npm",
        "@modelcontextprotocol/server-github",
        "mcp-server-github",
        (),
        {"GITHUB_PERSONAL_ACCESS_TOKEN": _DUMMY},
    ),  # fmt: skip
    Server(
        "slack-reference",
        "npm",
        "@modelcontextprotocol/server-slack",
        "mcp-server-slack",
        (),
        {"SLACK_BOT_TOKEN": _DUMMY, "SLACK_TEAM_ID": "T00000000"},
    ),  # fmt: skip
    Server(
        "google-maps",
        "npm",
        "@modelcontextprotocol/server-google-maps",
        "mcp-server-google-maps",
        (),
        {"GOOGLE_MAPS_API_KEY": _DUMMY},
    ),  # fmt: skip
    Server(
        "brave-search-reference",
        "npm",
        "@modelcontextprotocol/server-brave-search",
        "mcp-server-brave-search",
        (),
        {"BRAVE_API_KEY": _DUMMY},
    ),  # fmt: skip
    Server("puppeteer", "npm", "@modelcontextprotocol/server-puppeteer", "mcp-server-puppeteer"),
    Server(
        "postgres",
        "npm",
        "@modelcontextprotocol/server-postgres",
        "mcp-server-postgres",
        ("postgresql://nobody@127.0.0.1:1/none",),
    ),  # fmt: skip
    Server("notion", "npm", "@notionhq/notion-mcp-server", "notion-mcp-server", (), {"NOTION_TOKEN": _DUMMY}),
    Server(
        "mongodb",
        "npm",
        "mongodb-mcp-server",
        "mongodb-mcp-server",
        (),
        {
            "MDB_MCP_CONNECTION_STRING": "mongodb://127.0.0.1:1/none",
            "MDB_MCP_TELEMETRY": "disabled",
            "MDB_MCP_API_CLIENT_ID": _DUMMY,
            "MDB_MCP_API_CLIENT_SECRET": _DUMMY,
        },
    ),  # fmt: skip
    Server(
        "gitlab",
        "npm",
        "@zereight/mcp-gitlab",
        "mcp-gitlab",
        (),
        {
            "GITLAB_PERSONAL_ACCESS_TOKEN": _DUMMY,
            "GITLAB_API_URL": "http://127.0.0.1:1/api/v4",
            "USE_GITLAB_WIKI": "true",
            "USE_MILESTONE": "true",
            "USE_PIPELINE": "true",
        },
    ),  # fmt: skip
    Server("firecrawl", "npm", "firecrawl-mcp", "firecrawl-mcp", (), {"FIRECRAWL_API_KEY": _DUMMY}),
    Server("tavily", "npm", "tavily-mcp", "tavily-mcp", (), {"TAVILY_API_KEY": _DUMMY}),
    Server("desktop-commander", "npm", "@wonderwhy-er/desktop-commander", "desktop-commander"),
    Server("antv-chart", "npm", "@antv/mcp-server-chart", "mcp-server-chart"),
    Server(
        "circleci", "npm", "@circleci/mcp-server-circleci", "mcp-server-circleci", (), {"CIRCLECI_TOKEN": _DUMMY}
    ),  # fmt: skip
    Server("sentry", "npm", "@sentry/mcp-server", "sentry-mcp", ("--access-token", _DUMMY)),
    Server(
        "launchdarkly",
        "npm",
        "@launchdarkly/mcp-server",
        "@launchdarkly/mcp-server/bin/mcp-server.js",
        ("start", "--api-key", _DUMMY),
    ),
    Server("shortcut", "npm", "@shortcut/mcp", "mcp-server-shortcut", (), {"SHORTCUT_API_TOKEN": _DUMMY}),
    Server(
        "datadog",
        "npm",
        "@winor30/mcp-server-datadog",
        "mcp-server-datadog",
        (),
        {"DATADOG_API_KEY": _DUMMY, "DATADOG_APP_KEY": _DUMMY},
    ),  # fmt: skip
    Server(
        "atlassian-jira-aashari",
        "npm",
        "@aashari/mcp-server-atlassian-jira",
        "mcp-atlassian-jira",
        (),
        {"ATLASSIAN_SITE_NAME": "example", "ATLASSIAN_USER_EMAIL": "a@example.com", "ATLASSIAN_API_TOKEN": _DUMMY},
    ),  # fmt: skip
    Server("exa", "npm", "exa-mcp-server", "exa-mcp-server", (), {"EXA_API_KEY": _DUMMY}),
    Server(
        "brave-search",
        "npm",
        "@brave/brave-search-mcp-server",
        "brave-search-mcp-server",
        (),
        {"BRAVE_API_KEY": _DUMMY},
    ),  # fmt: skip
    Server(
        "figma", "npm", "figma-developer-mcp", "figma-developer-mcp", ("--stdio",), {"FIGMA_API_KEY": _DUMMY}
    ),  # fmt: skip
    Server("playwright-executeautomation", "npm", "@executeautomation/playwright-mcp-server", "playwright-mcp-server"),
    Server("context7", "npm", "@upstash/context7-mcp", "context7-mcp"),
    Server("eslint", "npm", "@eslint/mcp", "@eslint/mcp/src/mcp-cli.js"),
    Server(
        "kubernetes", "npm", "mcp-server-kubernetes", "mcp-server-kubernetes", (), {"KUBECONFIG": "{tmp}/kubeconfig"}
    ),
    Server(
        "browserbase",
        "npm",
        "@browserbasehq/mcp-server-browserbase",
        "mcp-server-browserbase",
        (),
        {"BROWSERBASE_API_KEY": _DUMMY, "BROWSERBASE_PROJECT_ID": _DUMMY},
    ),  # fmt: skip
    Server(
        "perplexity", "npm", "@perplexity-ai/mcp-server", "perplexity-mcp", (), {"PERPLEXITY_API_KEY": _DUMMY}
    ),  # fmt: skip
    Server("mobile", "npm", "@mobilenext/mobile-mcp", "mcp-server-mobile"),
    Server("currents", "npm", "@currents/mcp", "@currents/mcp/build/index.js", (), {"CURRENTS_API_KEY": _DUMMY}),
    # --- PyPI --------------------------------------------------------------------------------------------------
    Server("time", "pypi", "mcp-server-time", "mcp-server-time", ("--local-timezone", "UTC")),
    Server("fetch", "pypi", "mcp-server-fetch", "mcp-server-fetch"),
    Server("git", "pypi", "mcp-server-git", "mcp-server-git", ("--repository", "{repo}")),
    Server("sqlite", "pypi", "mcp-server-sqlite", "mcp-server-sqlite", ("--db-path", "{tmp}/db.sqlite")),
    Server(
        "atlassian",
        "pypi",
        "mcp-atlassian",
        "mcp-atlassian",
        (),
        {
            "JIRA_URL": "http://127.0.0.1:1",
            "JIRA_USERNAME": "a@example.com",
            "JIRA_API_TOKEN": _DUMMY,
            "CONFLUENCE_URL": "http://127.0.0.1:1/wiki",
            "CONFLUENCE_USERNAME": "a@example.com",
            "CONFLUENCE_API_TOKEN": _DUMMY,
        },
    ),  # fmt: skip
    Server("excel", "pypi", "excel-mcp-server", "excel-mcp-server", ("stdio",), {"EXCEL_FILES_PATH": "{tmp}"}),
    Server("word", "pypi", "office-word-mcp-server", "word_mcp_server"),
    Server(
        "clickhouse",
        "pypi",
        "mcp-clickhouse",
        "mcp-clickhouse",
        (),
        {
            "CLICKHOUSE_HOST": "127.0.0.1",
            "CLICKHOUSE_PORT": "1",
            "CLICKHOUSE_USER": "nobody",
            "CLICKHOUSE_PASSWORD": _DUMMY,
            "CLICKHOUSE_SECURE": "false",
        },
    ),  # fmt: skip
    Server("redis", "pypi", "redis-mcp-server", "redis-mcp-server", ("--url", "redis://127.0.0.1:1/0")),
    Server(
        "elasticsearch",
        "pypi",
        "elasticsearch-mcp-server",
        "elasticsearch-mcp-server",
        (),
        {
            "ELASTICSEARCH_HOSTS": "http://127.0.0.1:1",
            "ELASTICSEARCH_USERNAME": "nobody",
            "ELASTICSEARCH_PASSWORD": _DUMMY,
        },
    ),  # fmt: skip
    Server("arxiv", "pypi", "arxiv-mcp-server", "arxiv-mcp-server", ("--storage-path", "{tmp}")),
    Server("aws-documentation", "pypi", "awslabs-aws-documentation-mcp-server", "awslabs.aws-documentation-mcp-server"),
    Server(
        "aws-cloudwatch",
        "pypi",
        "awslabs-cloudwatch-mcp-server",
        "awslabs.cloudwatch-mcp-server",
        (),
        {"AWS_REGION": "us-east-1"},
    ),  # fmt: skip
    Server(
        "aws-dynamodb",
        "pypi",
        "awslabs-dynamodb-mcp-server",
        "awslabs.dynamodb-mcp-server",
        (),
        {"AWS_REGION": "us-east-1"},
    ),  # fmt: skip
    Server("aws-iam", "pypi", "awslabs-iam-mcp-server", "awslabs.iam-mcp-server", (), {"AWS_REGION": "us-east-1"}),
    Server(
        "aws-eks",
        "pypi",
        "awslabs-eks-mcp-server",
        "awslabs.eks-mcp-server",
        ("--allow-write",),
        {"AWS_REGION": "us-east-1"},
    ),  # fmt: skip
    Server(
        "aws-ecs",
        "pypi",
        "awslabs-ecs-mcp-server",
        "ecs-mcp-server",
        (),
        {"AWS_REGION": "us-east-1", "ALLOW_WRITE": "true"},
    ),  # fmt: skip
    Server("zotero", "pypi", "zotero-mcp", "zotero-mcp", (), {"ZOTERO_LOCAL": "true"}),
    Server(
        "grafana",
        "pypi",
        "mcp-grafana",
        "mcp-grafana",
        (),
        {"GRAFANA_URL": "http://127.0.0.1:1", "GRAFANA_API_KEY": _DUMMY},
    ),  # fmt: skip
)


def _version(scratch: Path, server: Server) -> str:
    if server.ecosystem == "npm":
        manifest = scratch / "npm" / "node_modules" / server.package / "package.json"
        return str(json.loads(manifest.read_text())["version"]) if manifest.is_file() else "?"
    wanted = server.package.lower().replace("-", "_").replace(".", "_")
    for dist in (scratch / "py" / f"v-{server.package}").glob("lib/python*/site-packages/*.dist-info"):
        name, _, version = dist.name.removesuffix(".dist-info").rpartition("-")
        if name.lower().replace("-", "_").replace(".", "_") == wanted:
            return version
    return "?"


def _command(scratch: Path, server: Server) -> Path:
    if server.ecosystem == "npm":
        if "/" in server.bin:  # a script: several packages install a bin of the same name (`mcp`)
            return scratch / "npm" / "node_modules" / server.bin
        return scratch / "npm" / "node_modules" / ".bin" / server.bin
    return scratch / "py" / f"v-{server.package}" / "bin" / server.bin


async def _list(scratch: Path, server: Server, work: Path, errlog: TextIO) -> list[dict[str, Any]]:
    def fill(value: str) -> str:
        return value.replace("{tmp}", str(work)).replace("{repo}", str(_HERE.parent))

    node_bin = Path(os.environ.get("NODE_BIN", "")) if os.environ.get("NODE_BIN") else None
    path = os.pathsep.join(p for p in (str(node_bin) if node_bin else "", os.environ.get("PATH", "")) if p)
    env = {"PATH": path, "HOME": str(work), "LANG": "C.UTF-8", "NO_COLOR": "1"}
    env.update({key: fill(value) for key, value in server.env.items()})
    command, args = str(_command(scratch, server)), [fill(a) for a in server.args]
    if server.ecosystem == "npm" and "/" in server.bin:
        command, args = "node", [command, *args]
    params = StdioServerParameters(command=command, args=args, env=env, cwd=str(work))
    async with stdio_client(params, errlog=errlog) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools: list[dict[str, Any]] = []
            cursor = None
            while True:
                page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
                for tool in page.tools:
                    dumped = tool.model_dump(by_alias=True, mode="json", exclude_none=True)
                    tools.append({k: dumped[k] for k in _FIELDS if k in dumped})
                cursor = page.next_cursor
                if not cursor:  # the scratch folder's path is this run's, not the server's: left out
                    return json.loads(json.dumps(tools).replace(str(work), "<working directory>"))


_FIELDS = ("name", "description", "inputSchema", "annotations")


_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: dummy}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def _digest(tool: dict[str, Any]) -> str:
    body = json.dumps([tool.get("description"), tool.get("inputSchema")], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def write_index() -> dict[str, Any]:
    """Rewrite ``index.json`` from the server files present; return it."""
    rows = []
    distinct: set[tuple[str, str, str]] = set()
    names: set[tuple[str, str]] = set()
    total = 0
    for path in sorted((OUT / "servers").glob("*.json")):
        data = json.loads(path.read_text())
        total += len(data["tools"])
        for tool in data["tools"]:
            distinct.add((data["package"], tool["name"], _digest(tool)))
            names.add((data["package"], tool["name"]))
        keys = ("variant", "package", "ecosystem", "version", "note")
        rows.append({**{key: data.get(key, "") for key in keys}, "tools": len(data["tools"])})
    index = {
        "variants": rows,
        "tool_rows": total,
        "distinct_tools": len(distinct),
        "distinct_names": len(names),
        "packages": len({r["package"] for r in rows}),
    }
    (OUT / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return index


async def main(errlog: TextIO) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scratch", type=Path, required=True, help="the folder holding npm/ and py/ installs")
    parser.add_argument("--only", action="append", default=[], help="a variant name (repeatable)")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    (OUT / "servers").mkdir(parents=True, exist_ok=True)
    chosen = [s for s in SERVERS if not args.only or s.variant in args.only]
    for server in chosen:
        if not _command(args.scratch, server).exists():
            print(f"skip {server.variant}: {_command(args.scratch, server).name} is not installed", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            (work / "kubeconfig").write_text(_KUBECONFIG)
            try:
                with anyio.fail_after(args.timeout):
                    tools = await _list(args.scratch, server, work, errlog)
            except Exception as exc:  # a third-party server failing to start: report it and go on
                while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
                    exc = exc.exceptions[0]
                print(f"FAIL {server.variant}: {type(exc).__name__}: {exc}"[:300], file=sys.stderr)
                continue
        record = {
            "variant": server.variant,
            "package": server.package,
            "ecosystem": server.ecosystem,
            "version": _version(args.scratch, server),
            "note": server.note,
            "tools": tools,
        }
        (OUT / "servers" / f"{server.variant}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"ok {server.variant}: {len(tools)} tools ({record['version']})", file=sys.stderr)
    index = write_index()
    print(json.dumps({k: v for k, v in index.items() if k != "variants"}), file=sys.stderr)


if __name__ == "__main__":
    with open(os.devnull, "w") as devnull:  # the servers' own chatter
        anyio.run(main, devnull)
