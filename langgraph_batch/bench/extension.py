"""What a research harness adds to `langgraph-batch bench`: the seam the wheel leaves open.

The wheel runs the standard workloads with the contenders a user compares on
their own server (`langgraph-batch`, plain LangGraph `naive` and
`naive-bounded[-<k>]`, the single-turn and simulation ones) and replays
recordings. The repository's research harness (the `langgraph-batch-benchmarks`
distribution in `benchmarks/`, run by `make bench`) adds the rest through
one `BenchExtension` subclass: the `ideal` and KV-valid bounds, the
batchagent contender in its own virtual environment, router contenders, the
issues' goals, the charts and results written into the checkout.

`BenchExtension` itself adds nothing; `use()` installs an extension for the
process (the research CLI does, before it calls `langgraph_batch.bench.cli.main`)
and `active()` is what the harness asks.

```python
from langgraph_batch.bench.extension import active

assert not active().knows("W1", "ideal")  # the wheel alone: no bounds
```
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langgraph_batch.bench.workloads import Workload

__all__ = ("BenchExtension", "active", "use")


class BenchExtension:
    """Hooks the harness calls; each default adds nothing (the wheel's behaviour)."""

    contenders: tuple[str, ...] = ()
    """Contender names this extension runs beyond the wheel's (listed in messages)."""

    def knows(self, workload: str, contender: str) -> bool:
        """Whether this extension runs `contender` on `workload` (the wheel's own: False).

        Args:
            workload: a workload id, or `"replay"` for `bench --replay`.
            contender: the contender's name as the user wrote it.

        Returns:
            True when the extension handles the name.
        """
        return False

    def base(self, contender: str) -> str:
        """The wheel contender whose process and job `contender` reuses (itself by default).

        Args:
            contender: a contender name.

        Returns:
            The base contender's name.
        """
        return contender

    def module(self, contender: str) -> str | None:
        """The module `python -m` runs for `contender`, when the extension provides it.

        Args:
            contender: a contender name.

        Returns:
            A module name, or None for the wheel's own.
        """
        return None

    def command(
        self, contender: str, cmd: list[str], env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """The command line and environment a contender's process starts with.

        Args:
            contender: the contender's name.
            cmd: the wheel's command (`[python, "-m", module]`).
            env: its environment.

        Returns:
            The command and environment to use.

        Raises:
            RuntimeError: the contender cannot run here (said in its result).
        """
        return cmd, env

    def bound(self, wl: Workload, *, n: int, seed: int) -> dict[str, Any]:
        """The `ideal` entry of a workload: a lower bound on its makespan.

        Args:
            wl: the workload.
            n: its siblings.
            seed: the run's seed.

        Returns:
            The entry (`makespan_s`, `note`, ...).

        Raises:
            NotImplementedError: the wheel computes no bounds.
        """
        raise NotImplementedError("the bounds are in the repository's research harness")

    def replay_bound(self, rp: Any, syn: Any, *, profile_name: str, start: str) -> dict[str, Any]:
        """The `ideal` entry of a replay (`bench --replay`).

        Args:
            rp: the replay plan (`replay_plan.ReplayPlan`).
            syn: its synthesis (`replay.Synthesis`).
            profile_name: the emulator cost profile.
            start: `"recorded"` or `"together"`.

        Returns:
            The entry.

        Raises:
            NotImplementedError: the wheel computes no bounds.
        """
        raise NotImplementedError("the bounds are in the repository's research harness")

    def live_refusal(self, contender: str) -> str | None:
        """Why `contender` cannot run against a live server (None: it can).

        Args:
            contender: the contender's name.

        Returns:
            The error recorded for it, or None.
        """
        return None

    @contextmanager
    def around(
        self,
        contender: str,
        job: dict[str, Any],
        *,
        urls: Sequence[str],
        profile: str,
        time_scale: float,
    ) -> Iterator[dict[str, Any]]:
        """Wrap one emulator run of `contender`; what it adds to the entry goes in the dict.

        Args:
            contender: the contender's name.
            job: its job, which the extension may point elsewhere (a router).
            urls: the emulator replicas.
            profile: the emulator's cost profile.
            time_scale: the emulator's time scale.

        Yields:
            A dict merged into the contender's entry after the run.

        Raises:
            RuntimeError: the contender is skipped (said in its result).
        """
        yield {}

    def finish(self, result: dict[str, Any]) -> None:
        """Add to a workload's result before it is written (goals, the checkout's commit).

        Args:
            result: the workload's result, changed in place.
        """

    def sections(self, contenders: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """Extra Markdown lines for a workload's report, after its tables.

        Args:
            contenders: the result's contenders.

        Returns:
            The lines (none by default).
        """
        return []

    def written(self, result: Mapping[str, Any], paths: dict[str, Path]) -> None:
        """Called after a workload's JSON and Markdown are written (charts go here).

        Args:
            result: the workload's result.
            paths: the files written so far, which the extension may add to.
        """

    def default_out(self) -> Path | None:
        """The results directory when `--out` is not given (None: `./bench-results`).

        Returns:
            A directory, or None.
        """
        return None


_active: BenchExtension = BenchExtension()


def active() -> BenchExtension:
    """The extension installed for this process (the wheel's: adds nothing).

    Returns:
        The active extension.
    """
    return _active


def use(extension: BenchExtension | None) -> BenchExtension:
    """Install `extension` for this process (None: the wheel's own); returns the previous one.

    Args:
        extension: the extension, or None.

    Returns:
        The extension that was active.
    """
    global _active
    previous, _active = _active, extension or BenchExtension()
    return previous
