"""The error for a missing optional dependency, naming the extra that brings it.

Example:
    ```python
    try:
        import uvicorn
    except ImportError:
        raise missing_extra("emulator", "the emulator needs uvicorn and starlette") from None
    ```
"""

from __future__ import annotations

__all__ = ("missing_extra",)


def missing_extra(extra: str, what: str) -> ImportError:
    """The `ImportError` to raise (`from None`) where an optional dependency is first needed.

    Args:
        extra: The `langgraph-batch[...]` extra that installs it.
        what: What needs it, e.g. `"the emulator needs uvicorn and starlette"`.

    Returns:
        `ImportError("<what>: pip install 'langgraph-batch[<extra>]'")`.
    """
    return ImportError(f"{what}: pip install 'langgraph-batch[{extra}]'")
