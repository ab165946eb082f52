"""What a run costs, priced from a table the user supplies.

Prices are the user's input: nothing here is a price list. A `Pricing`
holds one model's prices in US dollars per million tokens; a `PriceTable`
maps model names to them and loads from a JSON or TOML file (the CLI's
`--price prices.json`). Token counts come from usage: LangChain's
`usage_metadata` (`input_token_details.cache_read` / `cache_creation`,
`ephemeral_5m_input_tokens` / `ephemeral_1h_input_tokens`), OpenAI's `usage`
(`prompt_tokens_details.cached_tokens`) and Anthropic's `usage`
(`cache_creation_input_tokens`, `cache_read_input_tokens`).

How the providers price cache traffic and batches (the rules
`Pricing.anthropic` and `Pricing.openai` apply; check the pages for changes):

- Anthropic (https://docs.claude.com/en/docs/about-claude/pricing,
  "Prompt caching" and "Batch processing"): a 5-minute cache write costs
  1.25x the base input price, a 1-hour write 2x, a cache read 0.1x; the
  Message Batches API costs 50% of the standard price, and the discounts
  stack with caching.
- OpenAI (https://platform.openai.com/docs/pricing): cached input has its
  own listed price per model; cache writes cost the input price; the Batch
  API (https://platform.openai.com/docs/guides/batch) costs 50% less.

```python
table = PriceTable({"my-model": Pricing.anthropic(input=3.0, output=15.0)})
usage = TokenUsage(input_tokens=10_000, output_tokens=500, cache_read=8_000)
table.cost("my-model", usage).total  # 0.006 + 0.0024 + 0.0075 = 0.0159 dollars
```
"""

from __future__ import annotations

import json
import threading
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.outputs import LLMResult

__all__ = (
    "ANTHROPIC_CACHE_READ",
    "ANTHROPIC_CACHE_WRITE_1H",
    "ANTHROPIC_CACHE_WRITE_5M",
    "PROVIDER_BATCH_DISCOUNT",
    "Cost",
    "CostCallback",
    "CostMeter",
    "PriceTable",
    "Pricing",
    "TokenUsage",
    "usage_of_message",
)

ANTHROPIC_CACHE_WRITE_5M = 1.25
"""A 5-minute cache write, as a multiple of the base input price (Anthropic)."""
ANTHROPIC_CACHE_WRITE_1H = 2.0
"""A 1-hour cache write, as a multiple of the base input price (Anthropic)."""
ANTHROPIC_CACHE_READ = 0.1
"""A cache read (hit), as a multiple of the base input price (Anthropic)."""
PROVIDER_BATCH_DISCOUNT = 0.5
"""The share off every token that OpenAI's Batch API and Anthropic's Message Batches give."""

_PER_MILLION = 1e-6  # prices are quoted per million tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class Pricing:
    """One model's prices, US dollars per million tokens.

    Raises:
        ValueError: a negative price, or a batch discount outside [0, 1).
    """

    input: float
    """Uncached input tokens."""
    output: float
    """Output tokens."""
    cache_read: float | None = None
    """Input tokens read from the prompt cache (None: the input price)."""
    cache_write_5m: float | None = None
    """Input tokens written to a 5-minute cache (None: the input price)."""
    cache_write_1h: float | None = None
    """Input tokens written to a 1-hour cache (None: the 5-minute write price)."""
    batch_discount: float = 0.0
    """The share off every price through the provider's batch API (0.5: half price;
    0: the model has none)."""

    def __post_init__(self) -> None:
        for name in ("input", "output", "cache_read", "cache_write_5m", "cache_write_1h"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"Pricing.{name} must be >= 0 dollars per million, got {value!r}")
        if not 0 <= self.batch_discount < 1:
            raise ValueError(
                f"Pricing.batch_discount must be in [0, 1), got {self.batch_discount!r}"
            )

    @classmethod
    def anthropic(cls, *, input: float, output: float, batch: bool = True) -> Pricing:
        """Anthropic's rules from the base prices: writes 1.25x (5m) / 2x (1h), reads 0.1x.

        Args:
            input: the base input price per million tokens.
            output: the output price per million tokens.
            batch: whether Message Batches (50% off) apply to the model.
        """
        return cls(
            input=input,
            output=output,
            cache_read=input * ANTHROPIC_CACHE_READ,
            cache_write_5m=input * ANTHROPIC_CACHE_WRITE_5M,
            cache_write_1h=input * ANTHROPIC_CACHE_WRITE_1H,
            batch_discount=PROVIDER_BATCH_DISCOUNT if batch else 0.0,
        )

    @classmethod
    def openai(
        cls, *, input: float, output: float, cached_input: float | None, batch: bool = True
    ) -> Pricing:
        """OpenAI's rules: cached input at its listed price, writes at the input price.

        Args:
            input: the input price per million tokens.
            output: the output price per million tokens.
            cached_input: the listed cached-input price (None: the model has none).
            batch: whether the Batch API (50% off) applies to the model.
        """
        return cls(
            input=input,
            output=output,
            cache_read=cached_input,
            batch_discount=PROVIDER_BATCH_DISCOUNT if batch else 0.0,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Pricing:
        """From a file's entry: the fields above, or `rules` = `anthropic` / `openai`.

        `{"rules": "anthropic", "input": 3, "output": 15}` derives the cache prices
        and the batch discount by `Pricing.anthropic`; `{"rules": "openai", "input":
        2, "output": 8, "cached_input": 0.5}` by `Pricing.openai`; without `rules`
        every field is as written.

        Raises:
            ValueError: unknown rules or fields, or a bad value.
        """
        raw = dict(data)
        rules = raw.pop("rules", None)
        try:
            if rules == "anthropic":
                return cls.anthropic(**raw)
            if rules == "openai":
                return cls.openai(**{"cached_input": None, **raw})
            if rules is not None:
                raise ValueError(f"unknown pricing rules {rules!r}; use 'anthropic' or 'openai'")
            return cls(**raw)
        except TypeError as exc:
            raise ValueError(f"bad pricing entry {data!r}: {exc}") from None

    def cost(self, usage: TokenUsage, *, batch: bool = False) -> Cost:
        """What `usage` costs at these prices (`batch`: through the provider's batch API).

        Raises:
            ValueError: `batch` for a model without a batch discount.
        """
        if batch and not self.batch_discount:
            raise ValueError("this model has no batch discount (Pricing.batch_discount is 0)")
        scale = _PER_MILLION * ((1 - self.batch_discount) if batch else 1.0)
        read = self.input if self.cache_read is None else self.cache_read
        write_5m = self.input if self.cache_write_5m is None else self.cache_write_5m
        write_1h = write_5m if self.cache_write_1h is None else self.cache_write_1h
        return Cost(
            input=usage.uncached_input * self.input * scale,
            cache_read=usage.cache_read * read * scale,
            cache_write=(usage.cache_write_5m * write_5m + usage.cache_write_1h * write_1h) * scale,
            output=usage.output_tokens * self.output * scale,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenUsage:
    """Token counts of one or more calls, in LangChain's convention.

    `input_tokens` counts every prompt token, cached or not (OpenAI's
    `prompt_tokens`; Anthropic's `input_tokens + cache_creation_input_tokens +
    cache_read_input_tokens`).
    """

    input_tokens: int = 0
    """Every prompt token (uncached, read from cache, written to cache)."""
    output_tokens: int = 0
    """Generated tokens."""
    cache_read: int = 0
    """Prompt tokens read from the cache."""
    cache_write_5m: int = 0
    """Prompt tokens written to a 5-minute cache."""
    cache_write_1h: int = 0
    """Prompt tokens written to a 1-hour cache."""

    @property
    def uncached_input(self) -> int:
        """Prompt tokens neither read from nor written to a cache."""
        cached = self.cache_read + self.cache_write_5m + self.cache_write_1h
        return max(0, self.input_tokens - cached)

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read=self.cache_read + other.cache_read,
            cache_write_5m=self.cache_write_5m + other.cache_write_5m,
            cache_write_1h=self.cache_write_1h + other.cache_write_1h,
        )

    @classmethod
    def from_metadata(cls, usage: Mapping[str, Any]) -> TokenUsage:
        """From LangChain's `usage_metadata` (a cache write without a TTL counts as 5 minutes)."""
        details = usage.get("input_token_details") or {}
        w1h = int(details.get("ephemeral_1h_input_tokens") or 0)
        w5m = details.get("ephemeral_5m_input_tokens")
        if w5m is None:
            w5m = max(0, int(details.get("cache_creation") or 0) - w1h)
        return cls(
            input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            cache_read=int(details.get("cache_read") or 0),
            cache_write_5m=int(w5m),
            cache_write_1h=w1h,
        )

    @classmethod
    def from_openai(cls, usage: Mapping[str, Any]) -> TokenUsage:
        """From an OpenAI chat completion's `usage` (`prompt_tokens_details.cached_tokens`)."""
        details = usage.get("prompt_tokens_details") or {}
        return cls(
            input_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
            cache_read=int(details.get("cached_tokens") or 0),
        )

    @classmethod
    def from_anthropic(cls, usage: Mapping[str, Any]) -> TokenUsage:
        """From an Anthropic message's `usage` (its `input_tokens` excludes cache traffic)."""
        read = int(usage.get("cache_read_input_tokens") or 0)
        written = int(usage.get("cache_creation_input_tokens") or 0)
        split = usage.get("cache_creation") or {}
        w1h = int(split.get("ephemeral_1h_input_tokens") or 0)
        return cls(
            input_tokens=int(usage.get("input_tokens") or 0) + read + written,
            output_tokens=int(usage.get("output_tokens") or 0),
            cache_read=read,
            cache_write_5m=max(0, written - w1h),
            cache_write_1h=w1h,
        )

    def to_dict(self) -> dict[str, int]:
        """The counts as a plain dict."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read": self.cache_read,
            "cache_write_5m": self.cache_write_5m,
            "cache_write_1h": self.cache_write_1h,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Cost:
    """A cost in US dollars, by what it paid for."""

    input: float = 0.0
    """Uncached input tokens."""
    cache_read: float = 0.0
    """Input tokens read from the cache."""
    cache_write: float = 0.0
    """Input tokens written to the cache (5-minute and 1-hour)."""
    output: float = 0.0
    """Output tokens."""

    @property
    def total(self) -> float:
        """The sum."""
        return self.input + self.cache_read + self.cache_write + self.output

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            input=self.input + other.input,
            cache_read=self.cache_read + other.cache_read,
            cache_write=self.cache_write + other.cache_write,
            output=self.output + other.output,
        )

    def to_dict(self) -> dict[str, float]:
        """The parts and `total` as a plain dict."""
        return {
            "input": self.input,
            "cache_read": self.cache_read,
            "cache_write": self.cache_write,
            "output": self.output,
            "total": self.total,
        }


class PriceTable(Mapping[str, Pricing]):
    """Prices by model name: a mapping the user fills (or loads with `PriceTable.load`).

    A model is found by its exact name, else by the longest table name it
    starts with (`"claude-sonnet-4-5"` prices `"claude-sonnet-4-5-20250929"`).

    Example:
        ```python
        table = PriceTable({"gpt-4.1-mini": Pricing.openai(input=0.4, output=1.6,
                                                           cached_input=0.1)})
        ```
    """

    def __init__(self, prices: Mapping[str, Pricing] | None = None) -> None:
        """Build from `prices` (model name -> `Pricing`).

        Raises:
            TypeError: a value that is not a `Pricing`.
        """
        self._prices = dict(prices or {})
        for name, value in self._prices.items():
            if not isinstance(value, Pricing):
                raise TypeError(f"PriceTable[{name!r}] must be a Pricing, got {type(value)}")

    def __getitem__(self, model: str) -> Pricing:
        return self._prices[model]

    def __iter__(self) -> Iterator[str]:
        return iter(self._prices)

    def __len__(self) -> int:
        return len(self._prices)

    def __repr__(self) -> str:
        return f"PriceTable({self._prices!r})"

    def find(self, model: str | None) -> Pricing | None:
        """The prices of `model`, or None.

        Found by exact name, else by the longest prefix; a one-model table prices any model.
        """
        if model is not None:
            if model in self._prices:
                return self._prices[model]
            prefixes = [name for name in self._prices if model.startswith(name)]
            if prefixes:
                return self._prices[max(prefixes, key=len)]
        if len(self._prices) == 1:
            return next(iter(self._prices.values()))
        return None

    def cost(self, model: str | None, usage: TokenUsage, *, batch: bool = False) -> Cost:
        """What `usage` of `model` costs.

        Raises:
            KeyError: the table has no price for `model`.
        """
        pricing = self.find(model)
        if pricing is None:
            raise KeyError(f"no price for model {model!r}; the table has {sorted(self._prices)}")
        return pricing.cost(usage, batch=batch)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PriceTable:
        """From `{"models": {name: entry}}` (or `{name: entry}`), entries as `Pricing.from_dict`.

        Raises:
            ValueError: a malformed table.
        """
        models = data.get("models", data)
        if not isinstance(models, Mapping) or not all(
            isinstance(v, Mapping) for v in models.values()
        ):
            raise ValueError("a price table maps model names to pricing objects")
        return cls({str(name): Pricing.from_dict(entry) for name, entry in models.items()})

    @classmethod
    def load(cls, path: str | Path) -> PriceTable:
        """Read a JSON or TOML file (by its suffix; `.toml` is TOML, anything else JSON).

        Raises:
            OSError: the file cannot be read.
            ValueError: it is not a valid table.
        """
        path = Path(path)
        text = path.read_text()
        try:
            data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not a price table ({exc})") from None
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: a price table is an object")
        return cls.from_dict(data)


def usage_of_message(message: Any) -> TokenUsage | None:
    """The `TokenUsage` of a LangChain message's `usage_metadata`, or None without one."""
    usage = getattr(message, "usage_metadata", None)
    return TokenUsage.from_metadata(usage) if usage else None


class CostCallback(BaseCallbackHandler):
    """A callback handler that counts every chat model call's usage into a `CostMeter`."""

    def __init__(self, meter: CostMeter) -> None:
        """Count into `meter`."""
        self.meter = meter

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        """Count the usage of each generation's message."""
        for generations in response.generations:
            for generation in generations:
                message = getattr(generation, "message", None)
                if message is not None:
                    self.meter.add_message(message)


def _model_of(message: Any) -> str | None:
    meta = getattr(message, "response_metadata", None) or {}
    name = meta.get("model_name") or meta.get("model")
    return str(name) if name else None


@dataclass(slots=True)
class CostMeter:
    """Adds up usage and cost of many calls, by model (thread-safe).

    `fan_out(..., prices=table)` keeps one per run; its summary is in the
    run's progress events (`cost`) and, with `cost_into`, in the state.
    """

    prices: PriceTable | None = None
    """Prices; None counts tokens only."""
    default_model: str | None = None
    """The model a call without a model name is priced as."""
    _usage: dict[tuple[str, bool], TokenUsage] = field(default_factory=dict)
    _unpriced: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, model: str | None, usage: TokenUsage, *, batch: bool = False) -> None:
        """Count `usage` of one call to `model` (`batch`: through a provider batch API)."""
        key = (model or self.default_model or "", batch)
        with self._lock:
            self._usage[key] = self._usage.get(key, TokenUsage()) + usage

    def add_message(self, message: Any, *, batch: bool = False) -> None:
        """Count a LangChain message's `usage_metadata` (nothing when it has none)."""
        usage = usage_of_message(message)
        if usage is not None:
            self.add(_model_of(message), usage, batch=batch)

    def usage(self) -> TokenUsage:
        """Every call's tokens together."""
        with self._lock:
            parts = list(self._usage.values())
        return sum(parts, TokenUsage())

    def cost(self) -> Cost | None:
        """Every priced call's cost together (None without prices)."""
        if self.prices is None:
            return None
        total = Cost()
        with self._lock:
            entries = list(self._usage.items())
        for (model, batch), usage in entries:
            pricing = self.prices.find(model or None)
            if pricing is None or (batch and not pricing.batch_discount):
                self._unpriced.add(model)
                continue
            total += pricing.cost(usage, batch=batch)
        return total

    def summary(self) -> dict[str, Any]:
        """`{"usage": {...}, "cost": {...} | None, "unpriced_models": [...]}` (JSON-ready)."""
        cost = self.cost()
        return {
            "usage": self.usage().to_dict(),
            "cost": None if cost is None else cost.to_dict(),
            "unpriced_models": sorted(self._unpriced),
        }
