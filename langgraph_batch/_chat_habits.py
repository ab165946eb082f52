"""What a ChatOpenAI user expects of `BatchedChatModel` besides calls.

The short names beside ChatOpenAI's field names (`model`, `base_url`,
`api_key`, `timeout`), LangChain serialization (`dumps` / `loads`, the key as
a secret reference), and token counts from the server's tokenizer
(`get_num_tokens*`, see `_tokens`). A mixin: `BatchedChatModel` owns the
fields, this module the habits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from langchain_core.messages import BaseMessage
from pydantic import SecretStr

from langgraph_batch import _tokens
from langgraph_batch._convert import messages_to_openai
from langgraph_batch._loop import background_loop
from langgraph_batch._structured import format_tools

if TYPE_CHECKING:
    from langgraph_batch.scheduler import Scheduler

__all__ = ("ChatOpenAIHabits",)


class _Host(Protocol):
    """What the mixin reads of the model it is mixed into."""

    model_name: str
    openai_api_base: str
    openai_api_key: SecretStr | str | None
    request_timeout: float | None

    @property
    def model(self) -> str: ...
    @property
    def scheduler_key(self) -> str: ...
    def get_scheduler(self) -> Scheduler: ...
    def _count_sync(self, payload: dict[str, Any]) -> int: ...
    async def _acount(self, payload: dict[str, Any]) -> int: ...
    @staticmethod
    def _count_payload(
        messages: list[BaseMessage], tools: Sequence[Any] | None
    ) -> dict[str, Any]: ...


class ChatOpenAIHabits:
    """Mixin of `BatchedChatModel`: short names, serialization, token counts."""

    @property
    def model(self: _Host) -> str:
        """The model name (`model_name`)."""
        return self.model_name

    @property
    def base_url(self: _Host) -> str:
        """The server URL (`openai_api_base`)."""
        return self.openai_api_base

    @property
    def api_key(self: _Host) -> SecretStr | None:
        """The bearer token (`openai_api_key`), as a `SecretStr`."""
        key = self.openai_api_key
        return SecretStr(key) if isinstance(key, str) else key  # a str never stays one

    @property
    def timeout(self: _Host) -> float | None:
        """The HTTP read timeout per attempt (`request_timeout`)."""
        return self.request_timeout

    # -- LangChain serialization

    @classmethod
    def is_lc_serializable(cls) -> bool:
        """`langchain_core.load.dumps` writes the model's settings, secrets as references.

        `default_headers`, `policy`, `scheduler` and `backend` are not written
        (headers may carry credentials; the others are live objects): give them
        again after `loads`.
        """
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        """`["langgraph_batch", "chat_model"]`.

        Pass `valid_namespaces=["langgraph_batch"]` to `langchain_core.load.loads`.
        """
        return ["langgraph_batch", "chat_model"]

    @property
    def lc_secrets(self: _Host) -> dict[str, str]:
        """The API key is written as a reference to `LGB_API_KEY`, never its value."""
        return {"openai_api_key": "LGB_API_KEY"}

    # -- token counts

    def get_num_tokens(self: _Host, text: str) -> int:
        """Tokens in `text` by the server's tokenizer (`POST /tokenize`, cached).

        Falls back to ~4 characters per token, with one WARNING, when the server
        cannot count (see `langgraph_batch._tokens`). Blocks the calling thread
        for one round trip on a cache miss: in async code use `aget_num_tokens`.
        """
        return self._count_sync({"prompt": text})

    def get_num_tokens_from_messages(
        self: _Host, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """Prompt tokens a call with `messages` (and `tools`) costs.

        The server renders its chat template and counts, generation prompt
        included (cached).

        Example:
            ```python
            from langchain_core.messages import trim_messages

            short = trim_messages(history, max_tokens=2048, token_counter=llm)
            ```
        """
        return self._count_sync(self._count_payload(messages, tools))

    async def aget_num_tokens(self: _Host, text: str) -> int:
        """`get_num_tokens` without blocking the event loop."""
        return await self._acount({"prompt": text})

    async def aget_num_tokens_from_messages(
        self: _Host, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """`get_num_tokens_from_messages` without blocking the event loop."""
        return await self._acount(self._count_payload(messages, tools))

    @staticmethod
    def _count_payload(messages: list[BaseMessage], tools: Sequence[Any] | None) -> dict[str, Any]:
        return {
            "messages": messages_to_openai(messages),
            "tools": format_tools(tools) if tools else None,
        }

    def _count_sync(self: _Host, payload: dict[str, Any]) -> int:
        hit = _tokens.cached(self.scheduler_key, self.model, payload)
        if hit is not None:
            return hit
        loop = background_loop()
        if loop.in_loop_thread():  # waiting here would deadlock the loop that answers
            reason = "called from langgraph-batch's own event loop thread (use aget_num_tokens)"
            return _tokens.fallback(self.scheduler_key, payload, reason)
        return loop.run(self._acount(payload))

    async def _acount(self: _Host, payload: dict[str, Any]) -> int:
        backend = self.get_scheduler().backend
        return await _tokens.acount(backend, self.scheduler_key, self.model, payload)
