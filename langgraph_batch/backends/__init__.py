"""Backends: how requests reach an inference server (OpenAI-compatible, vLLM, SGLang)."""

from __future__ import annotations

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

__all__ = (
    "Backend",
    "BackendCapabilities",
    "ChatChunk",
    "ChatRequest",
    "ChatResponse",
    "EngineMetrics",
    "ModelInfo",
    "ToolCall",
    "ToolCallChunk",
    "Usage",
)
