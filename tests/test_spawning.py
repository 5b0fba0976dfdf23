"""The ``spawns`` mark keeps the fast run honest (tests/fixtures/spawning.py): a test that starts a process without
the mark fails, naming the command; a test that uses a fixture which starts processes is marked by that alone; and
``--fast`` leaves out every marked test. Each case runs pytest as a process of its own (pytester), on a tiny suite."""

from __future__ import annotations

import pytest

from tests.fixtures import ROOT

pytestmark = pytest.mark.spawns

SUITE = """
import subprocess
import sys

import pytest


def test_unmarked_that_starts_a_process() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.spawns
def test_marked_that_starts_a_process() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_through_a_spawning_fixture(gateway_process: object) -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_in_memory() -> None:
    assert sum([1, 2]) == 3
"""

CONFTEST = """
import pytest


@pytest.fixture
def gateway_process() -> object:
    return object()
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the plugin is tests.fixtures.spawning, not part of the package
    pytester.makeini("[pytest]\naddopts = --strict-markers -p tests.fixtures.spawning\nmarkers =\n    spawns: x\n")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def test_a_test_that_starts_a_process_without_the_mark_fails_naming_the_command(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_unmarked_that_starts_a_process*",
            "*this test started a process without the 'spawns' mark (refused: *'-c', 'pass'*",
            "E *.UnmarkedSpawn: *::test_unmarked_that_starts_a_process is not marked 'spawns' and may not start a *",
        ]
    )


def test_fast_leaves_out_the_marked_tests_and_those_marked_by_their_fixtures(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-v", "--fast", "-k", "not unmarked")
    result.assert_outcomes(passed=1, deselected=3)  # -k takes the unmarked one; --fast the two marked ones
    result.stdout.fnmatch_lines(["*::test_in_memory PASSED*"])
