"""`BatchedChatModel` and its parts: a LangChain chat model whose calls go through the scheduler.

```python
from langgraph_batch.chat_model import BatchedChatModel

llm = BatchedChatModel(model="my-model", base_url="vllm://127.0.0.1:8000")
```

The parts, each used by the model only:

    _model       BatchedChatModel: the fields, LangChain's interface, the way to
                 the scheduler (its backend key, its default policy)
    _fields      the bounds checked at construction, the environment's defaults
    _request     one call: LangChain input -> ChatRequest, run through the
                 scheduler, answered as LangChain output
    _convert     LangChain messages <-> the OpenAI chat-completions wire format
    _structured  bind_tools and with_structured_output
    _tokens      get_num_tokens* from the server's tokenizer (TokenCounter)
"""

from __future__ import annotations

from langgraph_batch.chat_model._model import BatchedChatModel

__all__ = ("BatchedChatModel",)
