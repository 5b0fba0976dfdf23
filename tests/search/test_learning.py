"""Learning from use (gateway/search/learning.py): a team's earlier choices nudge its alike requests, never another
team's; through the search exposure, a call of a tool the connection's last search found is what is learned."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.config import parse_config
from gateway.core.catalog import Catalog
from gateway.front.exposure import Disclosure
from gateway.search.learning import UseMemory
from gateway.search.ranking import load_embedder
from gateway.testing import FakeBackend, make_tool

pytestmark = pytest.mark.anyio


def test_a_choice_nudges_alike_requests_of_the_same_team_only() -> None:
    model = load_embedder()
    memory = UseMemory()
    assert memory.nudge("ops") is None
    asked, alike, unlike = model.embed(
        ["log 2 hours of work on PAY-33", "log three hours of work on PAY-40", "play some jazz"]
    )
    memory.record("ops", asked, "jira_add_worklog")
    learned = memory.nudge("ops")
    assert learned is not None
    bonus = learned(alike)
    assert set(bonus) == {"jira_add_worklog"} and bonus["jira_add_worklog"] > memory.weight * memory.min_similarity
    assert learned(unlike) == {}
    assert memory.nudge("sales") is None and memory.nudge(None) is None
    assert len(memory) == 1 and np.isclose(np.linalg.norm(asked), 1.0)


class _Connection:
    """Stands for a client connection (the Disclosure keys its last search by it, weakly)."""


async def test_a_call_of_a_found_tool_is_learned_for_the_callers_team_and_another_call_is_not() -> None:
    fed = parse_config(
        "servers:\n  jira:\n    transport: stdio\n    command: x\nexposure:\n  mode: search\n", file="f.yaml", env={}
    )
    jira = FakeBackend(
        "jira",
        [make_tool("jira_add_worklog", "Add a worklog entry to an issue."), make_tool("jira_get_issue", "Get one.")],
    )
    table = {"jira": jira}
    catalog = Catalog.build(fed, table)
    disclosure = Disclosure(lambda: fed, lambda: catalog, lambda: table, load_embedder)
    connection = _Connection()
    await disclosure.search({"query": "log 2 hours of work on PAY-33"}, None, "ops", connection)
    disclosure.called(connection, "jira_add_worklog")
    assert len(disclosure.memory) == 1
    disclosure.called(connection, "jira_add_worklog")  # the search was used once: a second call teaches nothing
    await disclosure.search({"query": "log 2 hours of work on PAY-33"}, None, "ops", connection)
    disclosure.called(connection, "something_else")
    assert len(disclosure.memory) == 1
    assert disclosure.memory.nudge("ops") is not None and disclosure.memory.nudge("sales") is None
