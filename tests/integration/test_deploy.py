"""The deploy recipes are safe by default: loopback binding, an API key from the environment.

The launch scripts run for real, with stand-ins for `vllm` and `python` on the
PATH that record the arguments and environment they were started with (no GPU,
no vLLM or SGLang here).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KEY = "test-key-0123456789abcdef"

RECORDER = """#!/usr/bin/env bash
# Records how it was started, as JSON, in $RECORD.
{
  printf '{"argv": ['
  first=1
  for a in "$@"; do
    [[ $first == 1 ]] || printf ', '
    first=0
    printf '"%s"' "$a"
  done
  printf '], "vllm_api_key": "%s"}' "${VLLM_API_KEY:-}"
} > "$RECORD"
"""


def launch(script: str, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("vllm", "python"):
        fake = bin_dir / name
        fake.write_text(RECORDER)
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "record.json"
    record.unlink(missing_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "HOST"}
    proc = subprocess.run(
        ["bash", str(DEPLOY / script)],
        env={**base, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    started = json.loads(record.read_text()) if record.exists() else None
    return proc, started


def value_after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("script", ["vllm/serve.sh", "sglang/serve.sh"])
def test_launch_scripts_bind_loopback_by_default(script: str, tmp_path: Path) -> None:
    proc, started = launch(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert value_after(started["argv"], "--host") == "127.0.0.1"
    assert "--api-key" not in started["argv"]


@pytest.mark.parametrize(
    ("script", "key_var"),
    [("vllm/serve.sh", "VLLM_API_KEY"), ("sglang/serve.sh", "SGLANG_API_KEY")],
)
def test_exposing_a_server_without_a_key_is_refused(
    script: str, key_var: str, tmp_path: Path
) -> None:
    proc, started = launch(script, tmp_path, HOST="0.0.0.0")
    assert proc.returncode == 2
    assert started is None  # the server never started
    assert key_var in proc.stderr
    assert "deploy/README.md" in proc.stderr
    proc, started = launch(script, tmp_path, HOST="0.0.0.0", ALLOW_UNAUTHENTICATED="1")
    assert proc.returncode == 0, proc.stderr
    assert value_after(started["argv"], "--host") == "0.0.0.0"


def test_vllm_gets_its_key_from_the_environment_not_the_command_line(tmp_path: Path) -> None:
    proc, started = launch("vllm/serve.sh", tmp_path, HOST="10.0.0.5", VLLM_API_KEY=KEY)
    assert proc.returncode == 0, proc.stderr
    assert started["vllm_api_key"] == KEY  # vLLM reads VLLM_API_KEY as it reads --api-key
    assert KEY not in " ".join(started["argv"])  # so it never shows in `ps`
    assert value_after(started["argv"], "--host") == "10.0.0.5"


def test_sglang_gets_its_key_as_api_key(tmp_path: Path) -> None:
    proc, started = launch("sglang/serve.sh", tmp_path, HOST="10.0.0.5", SGLANG_API_KEY=KEY)
    assert proc.returncode == 0, proc.stderr
    assert started["argv"][:2] == ["-m", "sglang.launch_server"]
    assert value_after(started["argv"], "--api-key") == KEY


def test_compose_publishes_on_loopback_and_passes_the_key() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yml").read_text())
    services = compose["services"]
    for name, service in services.items():
        for port in service.get("ports") or []:
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"
    assert services["vllm"]["environment"]["VLLM_API_KEY"] == "${VLLM_API_KEY:-}"
    for name in ("app", "example-code-review", "example-research"):
        assert services[name]["environment"]["LGB_API_KEY"] == "${VLLM_API_KEY:-}", name


def test_the_readme_explains_how_to_expose_a_server() -> None:
    text = (DEPLOY / "README.md").read_text()
    section = text.split("## Exposing a server", 1)[1].split("\n## ", 1)[0]
    for needed in ("VLLM_API_KEY", "SGLANG_API_KEY", "LGB_API_KEY", "TLS", "Firewall", "127.0.0.1"):
        assert needed in section, needed
