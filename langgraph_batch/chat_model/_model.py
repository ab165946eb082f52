"""`BatchedChatModel`: a LangChain chat model whose calls go through the shared scheduler.

Drop it in wherever a graph uses `ChatOpenAI` against vLLM or SGLang. Every
call (invoke, stream, batch, sync or async) becomes a `ChatRequest` that the
process-wide `Scheduler` for that server queues, admits under `max_inflight`,
retries and sends. Many concurrent agents (a `Send` map-reduce or `fan_out`)
thereby share one controlled stream of requests to the engine.

Sync calls run on one background event loop (`langgraph_batch._loop`), so a
sync graph's threads also meet in one scheduler.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, Self

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import LangSmithParams, LanguageModelInput
from langchain_core.language_models.chat_models import (
    BaseChatModel,
    agenerate_from_stream,
    generate_from_stream,
)
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils import secret_from_env
from pydantic import (
    AliasChoices,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from langgraph_batch._context import SiblingInfo
from langgraph_batch._loop import background_loop
from langgraph_batch._redact import safe_url
from langgraph_batch.backends import SessionConfig, backend_from_url, backend_key, check_api_key
from langgraph_batch.backends.base import (
    Backend,
    ChatChunk,
    ChatRequest,
    ChatResponse,
)
from langgraph_batch.chat_model._fields import BOUNDS, check_bound, float_env
from langgraph_batch.chat_model._request import (
    build_request,
    ls_params,
    run_call,
    stream_call,
    tool_call_check_for,
)
from langgraph_batch.chat_model._structured import (
    StructuredMethod,
    ToolLike,
    format_tools,
    normalize_tool_choice,
    structured_output,
    to_response_format,
)
from langgraph_batch.chat_model._tokens import TokenCounter
from langgraph_batch.scheduler import BatchPolicy, Scheduler
from langgraph_batch.scheduler.registry import scheduler_for

__all__ = ("BatchedChatModel",)

logger = logging.getLogger(__name__)

_DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"

# Starting in-flight limit of a default policy on a backend with engine metrics.
_INITIAL_INFLIGHT = 64


class BatchedChatModel(BaseChatModel):
    """A chat model for vLLM, SGLang or any OpenAI-compatible server, batched.

    All calls for one server (one `base_url`, or one `scheduler` name) go
    through one `Scheduler` per event loop, which holds at most
    `max_inflight` requests on the wire, retries transient errors
    (`max_retries`) and orders work by each agent's turn.

    Example:
        ```python
        from langgraph_batch.chat_model import BatchedChatModel

        llm = BatchedChatModel(
            model="meta-llama/Llama-3.1-8B-Instruct",
            base_url="vllm://127.0.0.1:8000",
            max_tokens=256,
            temperature=0.0,
            max_inflight=64,
        )
        answer = await llm.ainvoke("Name three prime numbers.")
        agent_llm = llm.bind_tools([search], tool_choice="auto")


        class Verdict(BaseModel):
            label: str
            confidence: float


        judge = llm.with_structured_output(Verdict)  # response_format json_schema
        ```
    """

    # Field names and aliases are ChatOpenAI's: users type the alias (`model=`,
    # `api_key=`, `base_url=`, `timeout=`) or the field name (`model_name=`, ...),
    # and type checkers see the alias in the constructor's signature.
    model_name: str = Field(alias="model")
    """Model name as the server knows it (`/v1/models`). Also `model`."""
    openai_api_base: str = Field(
        alias="base_url",
        default_factory=lambda: os.environ.get("LGB_BASE_URL", _DEFAULT_BASE_URL),
    )
    """`http(s)://host:port[/v1]`, `vllm://host:port`, `sglang://host:port` or
    `openai://host` (default: env `LGB_BASE_URL`, else the local vLLM port). Also
    `base_url`."""
    openai_api_key: SecretStr | str | None = Field(
        alias="api_key",
        default_factory=secret_from_env(["LGB_API_KEY", "OPENAI_API_KEY"], default=None),
    )
    """Bearer token (default: env `LGB_API_KEY`, then `OPENAI_API_KEY`; None for local
    servers). Also `api_key`. A `str` is accepted and kept as a `SecretStr`."""
    temperature: float | None = None
    logprobs: bool | None = None
    """Return each generated token's log probability (`response_metadata["logprobs"]`,
    ChatOpenAI's shape; per chunk when streaming)."""
    top_logprobs: int | None = None
    """With `logprobs`: the most likely alternatives per token (0-20)."""
    max_tokens: int | None = Field(
        default=None, validation_alias=AliasChoices("max_tokens", "max_completion_tokens")
    )
    """Most tokens to generate per call (`max_completion_tokens=` is accepted too)."""
    request_timeout: float | None = Field(default=None, alias="timeout")
    """HTTP read timeout per attempt, in seconds (None: the backend's default). Also
    `timeout`."""
    total_timeout: float | None = None
    """Limit on one call including queue wait and retries, in seconds (None: no limit)."""
    max_retries: int | None = None
    """Retries of transient failures (429, 5xx, dropped connections) by the scheduler; set, it
    wins for this model's calls (`Scheduler.submit`), None: `BatchPolicy.retry`'s (2)."""
    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    streaming: bool = False
    """Stream every call (`invoke` then aggregates the stream)."""
    stream_chunk_timeout: float | None = Field(
        default_factory=lambda: float_env("LGB_STREAM_CHUNK_TIMEOUT_S", 120.0)
    )
    """Streaming: the longest wait between two stream events, in seconds (None or 0:
    no limit; default 120, or env `LGB_STREAM_CHUNK_TIMEOUT_S`), as langchain-openai's
    option of the same name: SSE keep-alive comments do not reset it. When it passes,
    `StreamChunkTimeoutError` (a retryable `BackendTimeoutError`, logged at WARNING);
    retried when no content had reached the caller yet. Unlike langchain-openai, a
    negative value is refused (ValueError) rather than replaced by the default."""
    invalid_tool_calls: Literal["raise", "return"] = "raise"
    """What to do with a tool call the bound tools cannot take (arguments that are
    not JSON, not an object, miss a required property or have a wrong type, or a
    stream cut inside them). `"raise"` (default): retry the request (sampling
    noise; counted within `max_retries`), then raise `MalformedToolCallError`.
    `"return"`: return such calls in `AIMessage.invalid_tool_calls`, as `ChatOpenAI`
    does, for graphs that handle them (streams then aggregate as LangChain does).
    So is no call at all under a forced `tool_choice` (a name, `"required"`). vLLM >= 0.32
    pins a forced call's arguments to the schema only for strict tools: the vLLM backend
    sends forced tools as strict unless `bind_tools(..., strict=False)`."""
    max_inflight: int = 256
    """Hard cap on requests the shared scheduler keeps on the wire at once (applies
    when this model creates the scheduler). With engine metrics (vLLM, SGLang) the
    scheduler starts at min(64, this), raised to the engine's KV capacity when
    known, and adapts up to this cap while the server keeps no queue of its own;
    without metrics it uses the cap. 429/503 and preemptions lower the limit."""
    policy: BatchPolicy | None = Field(default=None, exclude=True)
    """Full scheduler policy for a scheduler this model creates (overrides `max_inflight`)."""
    scheduler: Any = Field(default=None, exclude=True)
    """A `Scheduler`, a registered scheduler name, or None (one per server URL)."""
    backend: Backend | None = Field(default=None, exclude=True)
    """An explicit backend instance (overrides `base_url`)."""
    default_headers: dict[str, str] | None = Field(default=None, repr=False, exclude=True)
    """Headers sent with every request, as `ChatOpenAI`'s (kept out of repr, dumps, logs).
    Models share a scheduler only when URL, key, headers and query all match."""
    default_query: dict[str, Any] | None = Field(default=None, repr=False)
    """Query parameters of every request URL, as `ChatOpenAI`'s (not for secrets)."""
    extra_body: dict[str, Any] | None = None
    """Extra JSON body fields (vLLM/SGLang extras such as `top_k`, `cache_salt`)."""
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Other body fields sent with every call."""
    session_affinity: SessionConfig | None = Field(default=SessionConfig(), exclude=True)
    """The opaque key each call carries for a router in front of replicas (one per fan_out
    sibling, else per conversation) and which calls a batch may mix. None: no key."""

    model_config = ConfigDict(
        populate_by_name=True, arbitrary_types_allowed=True, protected_namespaces=()
    )

    # ------------------------------------------------------------------ validation

    @field_validator("openai_api_base")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        backend_key(value)  # raises ValueError naming a bad URL
        return value

    @field_validator("openai_api_key", mode="before")
    @classmethod
    def _secret_key(cls, value: Any) -> Any:
        # Typed `SecretStr | str` so that `api_key="..."` type-checks; held as a SecretStr.
        return SecretStr(value) if isinstance(value, str) else value

    @field_validator(*BOUNDS)
    @classmethod
    def _check_number(cls, value: Any, info: ValidationInfo) -> Any:
        return check_bound(info.field_name or "", value)

    @model_validator(mode="after")
    def _check_scheduler(self) -> Self:
        if self.scheduler is not None and not isinstance(self.scheduler, str | Scheduler):
            msg = (
                f"scheduler must be a Scheduler, a registered scheduler name or None, "
                f"got {type(self.scheduler).__name__}"
            )
            raise ValueError(msg)
        if self.backend is None and not isinstance(self.scheduler, Scheduler):
            check_api_key(self.base_url, self._api_key())
        return self

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """The fields for `repr`, the URL's password masked (`_redact.safe_url`)."""
        for name, value in super().__repr_args__():
            yield name, safe_url(value) if name == "openai_api_base" and value else value

    # ------------------------------------------------------------------ ChatOpenAI's habits

    @property
    def model(self) -> str:
        """The model name (`model_name`)."""
        return self.model_name

    @property
    def base_url(self) -> str:
        """The server URL (`openai_api_base`)."""
        return self.openai_api_base

    @property
    def api_key(self) -> SecretStr | None:
        """The bearer token (`openai_api_key`), as a `SecretStr`."""
        key = self.openai_api_key
        return SecretStr(key) if isinstance(key, str) else key  # a str never stays one

    @property
    def timeout(self) -> float | None:
        """The HTTP read timeout per attempt (`request_timeout`)."""
        return self.request_timeout

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
        """`["langgraph_batch", "chat_model"]`: pass `valid_namespaces=["langgraph_batch"]`."""
        return ["langgraph_batch", "chat_model"]

    @property
    def lc_secrets(self) -> dict[str, str]:
        """The API key is written as a reference to `LGB_API_KEY`, never its value."""
        return {"openai_api_key": "LGB_API_KEY"}

    # ------------------------------------------------------------------ LangChain metadata

    @property
    def _llm_type(self) -> str:
        return "langgraph-batch"

    @property
    def provider(self) -> Literal["vllm", "sglang", "openai"]:
        """`"vllm"`, `"sglang"` or `"openai"` (any other OpenAI-compatible server)."""
        if self.backend is not None:
            return self.backend.capabilities.flavor
        scheme = self.base_url.partition("://")[0].lower()
        if scheme.startswith("vllm"):
            return "vllm"
        if scheme.startswith("sglang"):
            return "sglang"
        return "openai"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model,
            "base_url": self.base_url,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "stop": self.stop,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return ls_params(self, self.provider, stop, kwargs)

    # ------------------------------------------------------------------ tools / structured

    def bind_tools(
        self,
        tools: Sequence[ToolLike],
        *,
        tool_choice: Mapping[str, Any] | str | bool | None = None,
        strict: bool | None = None,
        parallel_tool_calls: bool | None = None,
        response_format: Any = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools (LangChain tools, functions, pydantic models or OpenAI dicts).

        Args:
            tools: The tools the model may call.
            tool_choice: `"auto"`, `"none"`, `"required"`, `"any"` (same as
                required), `True`, a tool name, or an OpenAI dict.
            strict: Ask for schema-exact arguments (`function.strict`). None: not
                stated (on vLLM, tools a forced `tool_choice` may call are sent
                strict, schemas unchanged); False: never strict.
            parallel_tool_calls: Set False to allow at most one call per turn.
            response_format: A schema for the final (non-tool) answer, as
                `create_agent`'s provider strategy passes it.
            **kwargs: Further call parameters, bound as they are.

        Returns:
            The model with the tools bound.

        Raises:
            ValueError: If `tool_choice` names a tool that is not bound.
        """
        formatted = format_tools(tools, strict=strict)
        names = [t["function"]["name"] for t in formatted if "function" in t]
        choice = normalize_tool_choice(tool_choice, names)
        if choice is not None:
            kwargs["tool_choice"] = choice
        if parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = parallel_tool_calls
        if response_format is not None:
            kwargs["response_format"] = to_response_format(response_format, strict=strict)
        return self.bind(tools=formatted, **kwargs)

    def with_structured_output(
        self,
        schema: Any = None,
        *,
        method: StructuredMethod = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        tools: Sequence[ToolLike] | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, Any]:
        """Return a runnable whose output follows `schema`.

        Args:
            schema: A pydantic class (output: an instance), a TypedDict or a
                JSON schema dict (output: a dict).
            method: `"json_schema"` (default; sent as `response_format`, which
                vLLM and SGLang enforce), `"function_calling"` or `"json_mode"`.
            include_raw: Output `{"raw", "parsed", "parsing_error"}` instead of
                raising when parsing fails.
            strict: The schema's `strict` flag.
            tools: With `json_schema`, tools the model may call instead.
            **kwargs: Call parameters to bind.

        Returns:
            A runnable taking the model's input.

        Raises:
            ValueError: On a bad method/schema/strict combination.

        Example:
            ```python
            class Answer(BaseModel):
                city: str


            structured = llm.with_structured_output(Answer, include_raw=True)
            out = await structured.ainvoke("Capital of France?")
            out["parsed"].city, out["parsing_error"]
            ```
        """
        return structured_output(
            self,
            schema,
            method=method,
            include_raw=include_raw,
            strict=strict,
            tools=tools,
            **kwargs,
        )

    # ------------------------------------------------------------------ requests

    def _api_key(self) -> str | None:
        key = self.api_key
        return key.get_secret_value() if key is not None else None

    def _backend_options(self) -> dict[str, Any]:  # what decides the backend and its key
        return {
            "api_key": self._api_key(),
            "headers": dict(self.default_headers) if self.default_headers else None,
            "query": dict(self.default_query) if self.default_query else None,
            "session_affinity": self.session_affinity,
        }

    def _make_backend(self) -> Backend:
        if self.backend is not None:
            return self.backend
        timeout: dict[str, Any] = {} if self.timeout is None else {"timeout": self.timeout}
        return backend_from_url(self.base_url, **self._backend_options(), **timeout)

    @property
    def backend_key(self) -> str:
        """The key of the backend this model calls: its endpoint and a credentials digest.

        Two models share a scheduler and an HTTP client only when their keys
        match, that is when URL, API key, `default_headers` and `default_query`
        are all equal. The key holds a sha256 prefix of those, never a secret.
        """
        if self.backend is not None:
            return self.backend.key
        return backend_key(self.base_url, **self._backend_options())

    @property
    def scheduler_key(self) -> str:
        """The registry key of the scheduler this model's calls share."""
        if isinstance(self.scheduler, str):
            return self.scheduler
        return self.backend_key

    def default_policy(self) -> BatchPolicy:
        """The policy of a scheduler this model creates when `policy` is None.

        Returns:
            `max_inflight` as the hard cap (and the limit without engine
            metrics), starting at min(64, cap) when engine metrics adapt it.
        """
        cap = self.max_inflight
        return BatchPolicy(
            inflight_limit=cap,
            inflight_cap=cap,
            initial_inflight=min(_INITIAL_INFLIGHT, cap),
        )

    def get_scheduler(self) -> Scheduler:
        """The `Scheduler` for the running event loop (created on first use).

        Returns:
            The explicit `scheduler` instance, or the registry's shared scheduler
            for this model's key in the running loop.
        """
        if isinstance(self.scheduler, Scheduler):
            return self.scheduler
        named = isinstance(self.scheduler, str)
        return scheduler_for(
            key=self.scheduler_key,
            backend_factory=self._make_backend,
            policy=self.policy or self.default_policy(),
            name=self.scheduler if named else None,
            backend_key=self.backend_key if named else None,
        )

    async def _submit(
        self,
        request: ChatRequest,
        sibling: SiblingInfo | None,
        on_chunk: Callable[[ChatChunk], None] | None = None,
    ) -> ChatResponse:
        scheduler = self.get_scheduler()
        return await scheduler.submit(
            request,
            sibling=sibling,
            max_retries=self.max_retries,
            timeout=self.total_timeout,
            on_chunk=on_chunk,
            check=tool_call_check_for(request, self.invalid_tool_calls),
        )

    # ------------------------------------------------------------------ token counts

    def _token_counter(self) -> TokenCounter:
        return TokenCounter(
            scope=self.scheduler_key, model=self.model, backend=lambda: self.get_scheduler().backend
        )

    def get_num_tokens(self, text: str) -> int:
        """Tokens in `text` by the server's tokenizer (`POST /tokenize`, cached).

        Falls back to ~4 characters per token, with one WARNING, when the server
        cannot count (see `langgraph_batch.chat_model._tokens`). Blocks the calling thread
        for one round trip on a cache miss: in async code use `aget_num_tokens`.
        """
        return self._token_counter().count({"prompt": text})

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """Prompt tokens a call with `messages` (and `tools`) costs, template included (cached).

        Example:
            ```python
            short = trim_messages(history, max_tokens=2048, token_counter=llm)
            ```
        """
        return self._token_counter().count(TokenCounter.payload(messages, tools))

    async def aget_num_tokens(self, text: str) -> int:
        """`get_num_tokens` without blocking the event loop."""
        return await self._token_counter().acount({"prompt": text})

    async def aget_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """`get_num_tokens_from_messages` without blocking the event loop."""
        return await self._token_counter().acount(TokenCounter.payload(messages, tools))

    # ------------------------------------------------------------------ async paths

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.streaming:
            return await agenerate_from_stream(
                self._astream(messages, stop=stop, run_manager=run_manager, **kwargs)
            )
        return await self._acall(messages, stop, kwargs)

    async def _acall(
        self, messages: Sequence[BaseMessage], stop: list[str] | None, kwargs: Mapping[str, Any]
    ) -> ChatResult:
        built = build_request(self, messages, stop, kwargs, stream=False)
        return await run_call(self._submit, built)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        async for chunk in self._stream_chunks(messages, stop, kwargs):
            if run_manager is not None:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    def _stream_chunks(
        self, messages: Sequence[BaseMessage], stop: list[str] | None, kwargs: Mapping[str, Any]
    ) -> AsyncIterator[ChatGenerationChunk]:
        # Built on first iteration, where the stream runs (the caller's task or the
        # background loop), as the call's sibling is read from the context there.
        build = lambda: build_request(self, messages, stop, kwargs, stream=True)  # noqa: E731
        return stream_call(self._submit, build)

    # ------------------------------------------------------------------ sync paths

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.streaming:
            return generate_from_stream(
                self._stream(messages, stop=stop, run_manager=run_manager, **kwargs)
            )
        return background_loop().run(self._acall(messages, stop, kwargs))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for chunk in background_loop().iterate(self._stream_chunks(messages, stop, kwargs)):
            if run_manager is not None:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk
