"""The examples run end to end against the emulator; the deploy recipes are well formed."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

# Flags every vLLM launch in deploy/ must carry (see deploy/vllm/README.md).
VLLM_FLAGS = (
    "--enable-prefix-caching",
    "--scheduling-policy",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "--enable-prompt-tokens-details",
    "--max-num-seqs",
)
SGLANG_FLAGS = (
    "--enable-metrics",
    "--enable-cache-report",
    "--tool-call-parser",
    "--enable-priority-scheduling",
)


def test_compose_file_is_valid_and_complete() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yml").read_text())
    services = compose["services"]
    assert {"vllm", "app"} <= set(services)

    vllm = services["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai")
    command = " ".join(vllm["command"])
    for flag in VLLM_FLAGS:
        assert flag in command, flag
    assert "--scheduling-policy=priority" in command
    assert "--disable-log-stats" not in command  # it would switch off /metrics
    assert "/health" in " ".join(vllm["healthcheck"]["test"])
    assert vllm["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]

    app = services["app"]
    assert app["environment"]["LGB_BACKEND_URL"] == "vllm://vllm:8000"
    assert app["depends_on"]["vllm"]["condition"] == "service_healthy"
    assert "/ok" in " ".join(app["healthcheck"]["test"])
    dockerfile = REPO / app["build"]["dockerfile"]  # relative to the build context
    assert (DEPLOY / app["build"]["context"]).resolve() == REPO  # relative to compose.yml
    assert dockerfile.is_file()
    for path in re.findall(r"^COPY (\S+)", dockerfile.read_text(), flags=re.M):
        assert (REPO / path).exists(), f"{dockerfile.name} copies missing {path}"

    for name, service in services.items():
        for script in re.findall(r"examples/\w+\.py", " ".join(service.get("command") or [])):
            assert (REPO / script).is_file(), f"service {name} runs missing {script}"


def test_launch_scripts_carry_the_documented_flags() -> None:
    vllm = (DEPLOY / "vllm" / "serve.sh").read_text()
    assert "exec vllm serve" in vllm
    for flag in VLLM_FLAGS:
        assert flag in vllm, flag
        assert flag in (DEPLOY / "vllm" / "README.md").read_text(), flag
    sglang = (DEPLOY / "sglang" / "serve.sh").read_text()
    assert "exec python -m sglang.launch_server" in sglang
    for flag in SGLANG_FLAGS:
        assert flag in sglang, flag
        assert flag in (DEPLOY / "sglang" / "README.md").read_text(), flag
