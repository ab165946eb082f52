"""langchain-tests' standard unit suite for BatchedChatModel."""

from __future__ import annotations

from typing import Any

from langchain_tests.unit_tests import ChatModelUnitTests

from langgraph_batch.chat_model import BatchedChatModel


class TestBatchedChatModelUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[BatchedChatModel]:
        return BatchedChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "emulated-llama-3-8b", "base_url": "vllm://127.0.0.1:8000"}

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        return (
            {"LGB_API_KEY": "api_key", "LGB_BASE_URL": "sglang://10.0.0.1:30000"},
            {"model": "emulated-llama-3-8b"},
            {"api_key": "api_key", "base_url": "sglang://10.0.0.1:30000"},
        )
