"""A variant's probe that says how to fix it ("Next: run `qmd pull`") is quoted with that command as the gateway runs
the program: in the adapter's folder, with its environment, the program it finds. Run by a person, that command fills
the cache the gateway reads (qmd's models under the project's .cache), not the person's own (~/.cache)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import anyio
import pytest

from gateway.config import parse_config
from gateway.core.runtime import Gateway

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

# A stand-in for qmd: `doctor` reports the models missing from its cache and says how to fetch them; `pull` fills
# the cache it is given (XDG_CACHE_HOME) and says where.
FAKE_QMD = textwrap.dedent(
    """\
    #!/bin/sh
    cache="${XDG_CACHE_HOME:-$HOME/.cache}/qmd/models"
    case "$1" in
      doctor)
        if [ -e "$cache/embedding.gguf" ]; then echo "model cache: ok"; exit 0; fi
        echo "⚠ model cache: missing 1/1: embedding: hf:org/model.gguf. Next: run \\`qmd pull\\`"
        ;;
      pull) mkdir -p "$cache" && touch "$cache/embedding.gguf" && echo "pulled into $cache" ;;
      search) echo "[]" ;;
    esac
    """
)


async def test_a_probes_advice_to_run_the_program_is_given_as_the_gateway_runs_it(tmp_path: Path) -> None:
    tools = tmp_path / ".tools" / "bin"
    tools.mkdir(parents=True)
    (tools / "qmd").write_text(FAKE_QMD)
    (tools / "qmd").chmod(0o755)
    config = f"""
gateway: {{audit: {{enabled: false}}}}
adapters:
  qmd:
    command: qmd
    cwd: .
    env: {{XDG_CACHE_HOME: ./.cache, PATH: "{tools}:/usr/bin:/bin"}}
    tools:
      files_search:
        input_schema: {{type: object, properties: {{mode: {{enum: [keyword, vector]}}}}}}
        switch: mode
        variants:
          keyword: {{argv: [search]}}
          vector:
            argv: [search]
            probe: {{argv: [doctor], unready_when: ["model cache: missing"]}}
"""
    federation = parse_config(config, file=str(tmp_path / "federation.yaml"), env={})
    async with Gateway(federation, audit=False).running() as gateway:
        with anyio.fail_after(20):
            assert await gateway.wait_settled(15, checked=True)  # the probes too (they run after the handshake)
        [(_, _, status)] = gateway.statuses()
    [(label, reason)] = status.unready
    command = f"cd {tmp_path} && XDG_CACHE_HOME={tmp_path}/.cache PATH={tools}:/usr/bin:/bin {tools}/qmd pull"
    assert label == "files_search[vector]"
    assert reason.endswith(f"(detected by `qmd doctor`; run it as the gateway does: `{command}`)"), reason
    done = await anyio.run_process(["sh", "-c", command], cwd="/")  # as a person pastes it, from anywhere
    assert done.stdout.decode().strip() == f"pulled into {tmp_path}/.cache/qmd/models"  # the cache the gateway reads
