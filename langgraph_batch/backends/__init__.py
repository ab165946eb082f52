"""Backends: how requests reach an inference server (OpenAI-compatible, vLLM, SGLang, Dynamo).

Example:
    ```python
    from langgraph_batch.backends import ChatRequest, backend_from_url

    async with backend_from_url("vllm://127.0.0.1:8000") as backend:
        resp = await backend.chat(
            ChatRequest(model="llama", messages=[{"role": "user", "content": "hi"}])
        )
    ```
"""

from __future__ import annotations

from langgraph_batch.backends._factory import backend_from_url, backend_key
from langgraph_batch.backends._factory import check_api_key as check_api_key
from langgraph_batch.backends._prometheus import parse_prometheus as parse_prometheus
from langgraph_batch.backends._session import SessionConfig
from langgraph_batch.backends.base import (
    Backend,
    BackendCapabilities,
    ChatChunk,
    ChatRequest,
    ChatResponse,
    EngineMetrics,
    ModelInfo,
    ToolCall,
    ToolCallChunk,
    Usage,
)
from langgraph_batch.backends.dynamo import DynamoBackend
from langgraph_batch.backends.langchain import LangChainBackend
from langgraph_batch.backends.openai_compat import OpenAICompatibleBackend
from langgraph_batch.backends.pool import EndpointPool
from langgraph_batch.backends.sglang import SGLangBackend
from langgraph_batch.backends.vllm import VLLMBackend

# Also importable from here, for the library's other packages (BatchedChatModel), and not part of
# `__all__` (no user API): check_api_key, parse_prometheus (the bench reads a router's metrics).
__all__ = (
    "Backend",
    "BackendCapabilities",
    "ChatChunk",
    "ChatRequest",
    "ChatResponse",
    "DynamoBackend",
    "EndpointPool",
    "EngineMetrics",
    "LangChainBackend",
    "ModelInfo",
    "OpenAICompatibleBackend",
    "SGLangBackend",
    "SessionConfig",
    "ToolCall",
    "ToolCallChunk",
    "Usage",
    "VLLMBackend",
    "backend_from_url",
    "backend_key",
)
