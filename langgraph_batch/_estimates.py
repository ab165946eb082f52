"""Every guess the library makes about sizes before a server has counted: tokens and KV.

Two kinds of estimate, each with its reason:

- **Tokens of a text**, when no tokenizer answers: `typical_tokens` (about
  `CHARS_PER_TOKEN` characters per token) where the estimate should be
  neither high nor low (`get_num_tokens`'s fallback, the split of a batched
  call's usage, a recording's prompt sizes), and `generous_tokens`
  (`GENEROUS_BYTES_PER_TOKEN`) where it guards a limit and over-estimating is
  the safe side (the batch length pre-filter). Both add `TEMPLATE_TOKENS` per
  chat message and round up: a non-empty text is at least one token.
- **KV of an agent**, before the server has said more: `CONTEXT_TOKENS_PRIOR`
  is what one request (the scheduler's starting in-flight limit,
  `BatchPolicy.kv_tokens_per_request`) or one fan_out sibling (its first-call
  prior, `sibling_tokens`) is expected to hold; `KV_HEADROOM` is the share of
  the cache fan_out's bookings may fill. `requests_fitting` and `kv_budget`
  are the two sizing rules built on them.

Who reads what:

    typical_tokens    _tokens (get_num_tokens without /tokenize), backends/_batching
                      (usage shares of a batched call), record/_format (shared prefix
                      without usage), bench/replay (turns without usage)
    generous_tokens   backends/_batching (the max_model_len pre-filter)
    CONTEXT_TOKENS_PRIOR  scheduler/_config (BatchPolicy.kv_tokens_per_request),
                      nodes (fan_out's sibling_tokens, SiblingAdmission)
    KV_HEADROOM       nodes (fan_out's kv_headroom, SiblingAdmission)
    requests_fitting  scheduler/_limit (the starting limit on the first KV sample)
    kv_budget         scheduler/_capacity (KVLedger.budget: what bookings may fill)

The emulator's tokenizer is not an estimate (it is the emulated server's
tokenizer, built to come out near `CHARS_PER_TOKEN`) and does not read this.
"""

from __future__ import annotations

__all__ = (
    "CHARS_PER_TOKEN",
    "CONTEXT_TOKENS_PRIOR",
    "DECODE_S_PER_TOKEN",
    "GENEROUS_BYTES_PER_TOKEN",
    "KV_HEADROOM",
    "PREFILL_S_PER_TOKEN",
    "TEMPLATE_TOKENS",
    "generous_tokens",
    "kv_budget",
    "requests_fitting",
    "typical_tokens",
)

CHARS_PER_TOKEN = 4
"""Characters per token of English text on the BPE tokenizers served models use
(Llama 3, Qwen 2.5, cl100k: about 4). Also UTF-8 bytes per token: the same for
ASCII text. The typical ratio, for estimates that should be neither high nor low."""

TEMPLATE_TOKENS = 8
"""Tokens a chat template adds per message, the call's own share included: role
markers and separators around each message (5 in ChatML's `<|im_start|>role\\n
... <|im_end|>\\n`, and in Llama 3's) plus the assistant header that opens the
answer (3-4, once per call). Measured on the emulator's ChatML: 10 for a
one-message chat, 17 for two, 22 for three, 41 for six. The same in both
estimates: the template is the server's, counted exactly as it renders it."""

GENEROUS_BYTES_PER_TOKEN = 3
"""UTF-8 bytes per token in the generous estimate: a third more tokens than the
typical one for English text, and bytes (not characters) so that non-ASCII text,
which takes more tokens per character, is counted high too. For estimates that
guard a limit, where over-estimating is safe: a batched prompt estimated too long
is only sent alone (the server's tokenizer then decides), one estimated too short
could fail a whole batched call."""

CONTEXT_TOKENS_PRIOR = 4096
"""The KV working set of one agent (tokens) before the server says more: what
the scheduler's starting limit assumes per request (`BatchPolicy.kv_tokens_per_request`)
and fan_out's admission per sibling (`sibling_tokens`) until its siblings' first
calls replace it with measured contexts. A short agent's system prompt, tools, task
and first answers; long contexts are learned, never assumed."""

KV_HEADROOM = 0.85
"""Share of the server's KV capacity fan_out's bookings may fill (`kv_headroom`).
The rest absorbs what bookings do not see: estimates that come out low, other
clients of the server, the blocks of requests being prefilled. Full bookings
would mean preemptions, whose recomputed prefill costs more than the 15% held back."""

PREFILL_S_PER_TOKEN = 1e-4
"""A model call's prefill time per prompt token (10,000 tokens/s), where an imported
trace gives no end time (`record.import_trace`): an order of magnitude, not a profile."""

DECODE_S_PER_TOKEN = 0.02
"""A model call's time per output token (50 tokens/s, one sequence), where an imported
trace gives no end time: an order of magnitude, not a profile."""


def typical_tokens(chars: int, *, messages: int = 0) -> int:
    """The typical token count of `chars` characters (or bytes) in `messages` chat messages.

    Args:
        chars: the text's length in characters (UTF-8 bytes are as good for English).
        messages: the chat messages it is split into (0: a plain prompt).

    Returns:
        `ceil(chars / CHARS_PER_TOKEN) + TEMPLATE_TOKENS * messages`.

    Example:
        ```python
        assert typical_tokens(10) == 3
        assert typical_tokens(400, messages=2) == 116
        ```
    """
    return -(-chars // CHARS_PER_TOKEN) + TEMPLATE_TOKENS * messages


def generous_tokens(nbytes: int, *, messages: int = 0) -> int:
    """A token count of `nbytes` UTF-8 bytes in `messages` messages that is rarely too low.

    Args:
        nbytes: the text's length in UTF-8 bytes.
        messages: the chat messages it is split into (0: a plain prompt).

    Returns:
        `ceil(nbytes / GENEROUS_BYTES_PER_TOKEN) + TEMPLATE_TOKENS * messages`.

    Example:
        ```python
        assert generous_tokens(3000) == 1000
        ```
    """
    return -(-nbytes // GENEROUS_BYTES_PER_TOKEN) + TEMPLATE_TOKENS * messages


def requests_fitting(capacity_tokens: int, tokens_per_request: int) -> int:
    """How many requests of `tokens_per_request` a KV cache of `capacity_tokens` holds.

    The whole capacity, no headroom: the scheduler starts its in-flight limit
    there and lowers it on the first preemption (a starting point, corrected
    by the engine), where fan_out's bookings must not cause one (`kv_budget`).

    Example:
        ```python
        assert requests_fitting(440_000, 4096) == 107
        ```
    """
    return capacity_tokens // tokens_per_request


def kv_budget(capacity_tokens: int, headroom: float) -> int:
    """The KV tokens bookings may fill: `headroom` of the capacity (at least 1).

    Example:
        ```python
        assert kv_budget(440_000, KV_HEADROOM) == 374_000
        ```
    """
    return max(1, int(capacity_tokens * headroom))
