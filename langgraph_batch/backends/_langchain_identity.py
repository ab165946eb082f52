"""Who a wrapped LangChain model is: its name, its kind, its configuration's fingerprint.

`LangChainBackend` keys its scheduler by the model's class, name and a
fingerprint of every field, so two equally configured models share one
scheduler and two that differ (another API key, another temperature) do
not.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from enum import Enum
from typing import Any

from langchain_core.language_models import BaseChatModel
from pydantic import BaseModel, SecretBytes, SecretStr

__all__ = ("fingerprint", "is_openai_like", "model_name")

# Keys are HMACs under a per-process salt: equal configurations share a key
# within the process, and a key in a log cannot be used to test guesses of a
# credential offline.
_SALT = secrets.token_bytes(16)

_MODEL_NAME_FIELDS = ("model_name", "model", "model_id", "deployment_name")


def is_openai_like(model: BaseChatModel) -> bool:
    """True for langchain-openai's models and their subclasses (DeepSeek, xAI, ...)."""
    return any(cls.__name__ == "BaseChatOpenAI" for cls in type(model).__mro__)


def model_name(model: BaseChatModel) -> str:
    """The model's name from its usual fields, else its class name."""
    for name in _MODEL_NAME_FIELDS:
        value = getattr(model, name, None)
        if isinstance(value, str) and value:
            return value
    return type(model).__name__


def _canonical(value: Any, depth: int = 0) -> Any:
    """A JSON-able stand-in for a field value, for the configuration fingerprint.

    Secrets are included (only ever hashed); objects without a value form
    (HTTP clients, callbacks) count by their type.
    """
    if depth > 8:
        return "<deep>"
    if isinstance(value, SecretStr | SecretBytes):
        return {"secret": str(value.get_secret_value())}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Enum):
        return _canonical(value.value, depth + 1)
    if isinstance(value, Mapping):
        return {str(k): _canonical(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_canonical(v, depth + 1) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        return {
            "type": type(value).__qualname__,
            "fields": {n: _canonical(getattr(value, n, None), depth + 1) for n in fields},
        }
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def fingerprint(model: BaseChatModel) -> str:
    """A short HMAC of the model's class and every field (secrets included, only hashed).

    Equal configurations share it within the process; under a per-process salt,
    a fingerprint in a log cannot be used to test guesses of a credential.
    """
    fields = type(model).model_fields
    state = {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "fields": {name: _canonical(getattr(model, name, None)) for name in sorted(fields)},
    }
    payload = json.dumps(state, sort_keys=True, default=str).encode()
    return hmac.new(_SALT, payload, hashlib.sha256).hexdigest()[:16]
