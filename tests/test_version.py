"""The version (``gateway/version.py``) is the one pyproject.toml declares, read from the installed distribution's
metadata, and it is what ``gateway --version`` prints."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.version import DISTRIBUTION, VERSION

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_the_version_is_the_one_pyproject_toml_declares() -> None:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    assert (DISTRIBUTION, VERSION) == (project["name"], project["version"])


def test_gateway_version_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"gateway {VERSION}\n"
