"""Test doubles shared by the whole suite, one module per thing they stand in for.

- `backends`: `Backend` implementations (scripted, instant, event-gated).
- `chat_models`: LangChain chat models (a provider stand-in, scripted agents).
- `fan_out`: a fake queue and admission, small subgraphs, `parent_graph`.
- `http`: a recording `httpx.MockTransport`, response and SSE builders.
"""
