"""`ast.parse` for tests that read source while other threads may be parsing too.

CPython 3.11 shares the AST converter's recursion counter between threads
(gh-106905): a parse in one thread while another thread parses (LangChain reads
a lambda's source when it builds a `RunnableLambda`, in a background loop left
by an earlier test of the same pytest-xdist worker) can raise "SystemError: AST
constructor recursion depth mismatch". That error says nothing about the source,
so the parse is tried again.
"""

from __future__ import annotations

import ast

_ATTEMPTS = 5


def parse_source(source: str) -> ast.Module:
    """`ast.parse(source)`, tried again after gh-106905's spurious `SystemError`."""
    for _ in range(_ATTEMPTS - 1):
        try:
            return ast.parse(source)
        except SystemError:
            continue
    return ast.parse(source)
