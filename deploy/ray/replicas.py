"""One inference replica per GPU node of a Ray cluster, on loopback, for RayExecutor.

    ray start --head --num-cpus 1 --include-dashboard=false        # on the head
    ray start --address HEAD:6379                                   # on each GPU node
    MODEL=Qwen/Qwen2.5-7B-Instruct python deploy/ray/replicas.py --address HEAD:6379

Each replica is a plain Ray actor (one GPU, pinned to its node) that runs
`deploy/vllm/serve.sh` as a child process bound to 127.0.0.1:PORT, waits for
its `/health`, and keeps it running until the actor is killed; the actors are
detached and named `lgb-replica-<node id>` in the namespace `langgraph-batch`.
The script prints the node ids that got a replica: give them to `RayExecutor`
as `node_for`, so every sibling runs on a node with a replica and its graph's
`BatchedChatModel(base_url="vllm://127.0.0.1:PORT")` reaches that node's
own replica on loopback (nothing listens beyond the machine).

`--emulator` starts `python -m langgraph_batch.emulator` instead of vLLM (no
GPU needed; how the recipe is checked on a laptop). `--stop` kills the replicas.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

SERVE = Path(__file__).resolve().parents[1] / "vllm" / "serve.sh"
NAMESPACE = "langgraph-batch"


@ray.remote
class Replica:
    """One server process on this node's loopback."""

    def __init__(self, host: str, port: int, emulator: bool) -> None:
        if emulator:
            cmd = [sys.executable, "-m", "langgraph_batch.emulator"]
            cmd += ["--host", host, "--port", str(port)]
        else:
            cmd = ["bash", str(SERVE)]
        env = {**os.environ, "HOST": host, "PORT": str(port)}
        self.port = port
        self.proc = subprocess.Popen(cmd, env=env)

    def ready(self, timeout: float) -> str:
        """Wait for `/health`; return the node id (raises when the server exited)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return ray.get_runtime_context().get_node_id()
            except OSError:
                time.sleep(1.0)
        raise RuntimeError(f"no /health on 127.0.0.1:{self.port} after {timeout} s")

    def stop(self) -> None:
        """Terminate the server (then the actor can be killed)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def main() -> int:
    """Start (or with `--stop`, stop) the replicas; print the node ids that have one."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--address", default="auto")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--gpus", type=float, default=1.0, help="GPUs per replica (1)")
    p.add_argument("--emulator", action="store_true", help="the emulator instead of vLLM")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for /health")
    p.add_argument("--stop", action="store_true", help="stop the replicas")
    args = p.parse_args()
    ray.init(address=args.address, namespace=NAMESPACE, log_to_driver=False)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    if not args.emulator:
        nodes = [n for n in nodes if n["Resources"].get("GPU", 0) >= args.gpus]
    if args.stop:
        for node in nodes:
            try:
                actor = ray.get_actor(f"lgb-replica-{node['NodeID']}")
            except ValueError:
                continue
            ray.get(actor.stop.remote())
            ray.kill(actor)
        return 0
    replicas = [
        Replica.options(
            name=f"lgb-replica-{node['NodeID']}",
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            num_gpus=0 if args.emulator else args.gpus,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        ).remote(args.host, args.port, args.emulator)
        for node in nodes
    ]
    ready = ray.get([r.ready.remote(args.timeout) for r in replicas])
    for node_id in ready:
        print(node_id)  # noqa: T201 - the output is the node list
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
