"""The deploy recipes are safe by default: loopback binding, an API key from the environment.

The launch scripts run for real, with stand-ins for `vllm` and `python` on the
PATH that record the arguments and environment they were started with (no GPU,
no vLLM or SGLang here).
"""

from __future__ import annotations

import json
import os
import re
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


def test_router_profile_puts_vllm_router_in_front_of_unpublished_replicas() -> None:
    services = yaml.safe_load((DEPLOY / "compose.yml").read_text())["services"]
    replicas = {name: s for name, s in services.items() if name.startswith("vllm-r")}
    router = services["router"]
    assert len(replicas) >= 2
    assert router["profiles"] == ["router"]
    argv = router["command"]
    start = argv.index("--worker-urls") + 1
    workers = [a for a in argv[start:] if not a.startswith("--")]
    assert workers == [f"http://{name}:8000" for name in sorted(replicas)]
    assert "--policy=${ROUTER_POLICY:-consistent_hash}" in argv  # routes on X-Session-ID
    assert set(router["depends_on"]) == set(replicas)
    assert router["ports"] == ["127.0.0.1:8100:8000"]
    gpus = []
    for name, replica in replicas.items():
        assert replica["profiles"] == ["router"], name
        assert replica["ports"] == [], f"{name} must be reached through the router only"
        assert replica["command"] == services["vllm"]["command"], name  # the same flags
        assert replica["environment"]["VLLM_API_KEY"] == "${VLLM_API_KEY:-}", name
        gpus += replica["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
    assert len(set(gpus)) == len(gpus)  # one GPU each
    dockerfile = (DEPLOY / "router" / "Dockerfile").read_text()
    assert router["build"]["dockerfile"] == "deploy/router/Dockerfile"
    pinned = re.search(r"vllm-router==([\d.]+)", dockerfile)
    assert pinned is not None
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f"vllm-router>={pinned.group(1)}," in pyproject  # the version the tests ran
    assert "USER nobody" in dockerfile


def test_router_profile_flags_exist_in_the_real_router() -> None:
    from benchmarks.routers import router_command, router_unavailable

    reason = router_unavailable("vllm-router")
    if reason is not None:
        pytest.skip(reason)
    services = yaml.safe_load((DEPLOY / "compose.yml").read_text())["services"]
    exe = router_command("vllm-router", "consistent_hash", 1, ["http://x:1"])[0]
    help_text = subprocess.run(
        [exe, "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    for arg in services["router"]["command"]:
        if arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            assert flag in help_text, flag
