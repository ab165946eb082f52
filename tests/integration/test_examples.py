"""The examples run end to end against the emulator; the deploy recipes are well formed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

# Live servers (read at import: the autouse hermetic_env fixture clears LGB_* per test).
LIVE_SERVERS = {
    "vllm": os.environ.get("LGB_VLLM_URL"),  # e.g. vllm://gpu1:8000 (deploy/vllm/serve.sh)
    "sglang": os.environ.get("LGB_SGLANG_URL"),  # e.g. sglang://gpu1:30000
}

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


@pytest.fixture(scope="module")
def example_emulator() -> Iterator[str]:
    """This module's own emulator (fast clock)."""
    from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess

    with EmulatorProcess(EmulatorConfig(port=0, time_scale=50.0)) as emulator:
        yield emulator.url


def run_example(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Run `examples/<script>` as a user would; return its stdout (fails on exit != 0)."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / script), *args, "--quiet"],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=45,
        check=False,
    )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_code_review_example(example_emulator: str) -> None:
    url = example_emulator.replace("http://", "vllm://")  # the vLLM backend
    out = run_example("code_review.py", "--n", "6", "--groups", "3", "--backend-url", url)
    assert f"backend: {url} model: emulated-llama-3-8b (EMULATED)" in out
    assert "files: 6 reviewed: 6 failed: 0" in out
    assert re.search(r"findings: \d+ by severity: \{'high': \d+", out), out
    # Two files per package: the emulator requests identical read_file calls per package.
    assert "tool calls: requested 6 executed 3 shared 3" in out, out
    # 6 reviewers x 2 turns through the shared scheduler; the emulator caches shared prefixes.
    stats = re.search(r"llm calls: (\d+) failed 0 retries \d+; prompt tokens \d+ \((\d+)% c", out)
    assert stats, out
    assert int(stats.group(1)) == 12
    assert int(stats.group(2)) > 0


def test_research_example(start_emulator: Callable[..., str]) -> None:
    # SGLang's flavour of the emulator, through the SGLang backend.
    url = start_emulator(flavor="sglang").replace("http://", "sglang://")
    out = run_example("research.py", "--n", "6", "--clusters", "2", "--backend-url", url)
    assert "(EMULATED)" in out
    assert "sub-questions: 6 researched: 6 failed: 0" in out
    assert "tool calls: requested 6 executed 2 shared 4" in out, out
    report = out.split("report:\n", 1)[1]
    assert report.strip(), "empty synthesis"


def test_example_starts_and_stops_its_own_emulator() -> None:
    out = run_example("research.py", "--n", "2", env={"LGB_EMULATOR_TIME_SCALE": "50"})
    match = re.search(r"backend: (http://127\.0\.0\.1:\d+) model: \S+ \(EMULATED\)", out)
    assert match, out
    assert "sub-questions: 2 researched: 2 failed: 0" in out
    with pytest.raises(httpx.ConnectError):  # stopped at exit
        httpx.get(f"{match.group(1)}/health", timeout=2.0)


@pytest.mark.parametrize("engine", sorted(LIVE_SERVERS))
def test_code_review_against_a_live_server(engine: str) -> None:
    url = LIVE_SERVERS[engine]
    if not url:
        pytest.skip(f"set LGB_{engine.upper()}_URL to run the example against a live {engine}")
    out = run_example("code_review.py", "--n", "4", "--groups", "2", "--backend-url", url)
    assert "(EMULATED)" not in out
    assert "files: 4 reviewed: 4 failed: 0" in out, out


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

    redis, worker = services["redis"], services["worker"]
    assert redis["image"].startswith("redis:")
    assert "ping" in redis["healthcheck"]["test"]
    assert worker["command"][:3] == ["langgraph-batch", "worker", "redis://redis:6379/0"]
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    assert worker["environment"]["LGB_BACKEND_URL"] == "vllm://vllm:8000"
    assert worker["environment"]["LGB_API_KEY"] == "${VLLM_API_KEY:-}"  # vLLM may need the key
    # The default graph is a sibling graph the worker can load (not the parent graph).
    default = re.fullmatch(r"\$\{WORKER_GRAPH:-(.+)\}", worker["command"][3])
    assert default is not None, worker["command"]
    from langgraph_batch.distributed.worker import load_graph

    sibling = load_graph(default.group(1), app_dir=str(REPO))
    assert sibling.name == "answerer"
    assert "ports" not in worker  # workers bind nothing
    assert redis["profiles"] == worker["profiles"] == ["distributed"]
    assert ",redis]" in (REPO / worker["build"]["dockerfile"]).read_text()  # the extra

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


def test_bench_recipe_serves_random_weights_on_loopback(tmp_path: Path) -> None:
    # A stand-in `vllm` prints the command line the recipe would run.
    fake = tmp_path / "vllm"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}", MODEL="/models/llama3")
    out = subprocess.run(
        [str(DEPLOY / "vllm" / "bench.sh"), "--seed", "1"],
        capture_output=True, text=True, env=env, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert out[:2] == ["serve", "/models/llama3"]
    assert out[out.index("--host") + 1] == "127.0.0.1"
    assert out[out.index("--load-format") + 1] == "dummy"
    config = json.loads(out[out.index("--structured-outputs-config") + 1])
    assert config == {"backend": "xgrammar", "disable_any_whitespace": True}
    assert "--enable-prefix-caching" in out
    assert "--disable-log-stats" not in out
    assert out[-2:] == ["--seed", "1"]  # extra flags pass through
    missing = subprocess.run(
        [str(DEPLOY / "vllm" / "bench.sh")],
        capture_output=True, text=True, env={k: v for k, v in env.items() if k != "MODEL"},
    )  # fmt: skip
    assert missing.returncode != 0
    assert "MODEL" in missing.stderr


def test_simulation_example(example_emulator: str) -> None:
    url = example_emulator.replace("http://", "vllm://")
    out = run_example("simulation.py", "--agents", "6", "--ticks", "3", "--backend-url", url)
    assert f"backend: {url} model: emulated-llama-3-8b (EMULATED)" in out
    for tick in (1, 2, 3):
        assert f"tick {tick}: 6 acted, 0 failed" in out, out
    # Rules and persona, then an action and an observation for each tick after the first.
    assert "resident 0 remembers 6 messages" in out, out
    stats = re.search(r"llm calls: (\d+) failed 0", out)
    assert stats, out
    assert int(stats.group(1)) == 6 * 3
