"""The hosted prompt-caching rules: Anthropic's and OpenAI's."""

from __future__ import annotations

import pytest

from langgraph_batch.emulator._anthropic_cache import (
    LOOKBACK_BLOCKS,
    Block,
    CacheRuleError,
    PromptCache,
    chain_digests,
    min_cacheable_tokens,
)
from langgraph_batch.emulator._openai_cache import OpenAIPromptCache, cacheable_lengths


def _blocks(sizes: list[int], ttls: dict[int, str], *, tag: str = "") -> list[Block]:
    parts = [f"{tag}{i}" if i else "p0" for i in range(len(sizes))]
    digests = chain_digests("claude-sonnet-5", parts)
    pairs = enumerate(zip(sizes, digests, strict=True))
    return [Block(tokens=n, digest=d, ttl=ttls.get(i)) for i, (n, d) in pairs]


# -- Anthropic -------------------------------------------------------------------


def test_first_request_writes_and_a_later_one_reads() -> None:
    cache = PromptCache("claude-sonnet-5")
    blocks = _blocks([2000, 50], {0: "5m"})
    first = cache.plan(blocks, now=0.0)
    assert (first.cache_creation_input_tokens, first.input_tokens) == (2000, 50)
    assert first.ephemeral_5m_input_tokens == 2000
    cache.commit(first, now=1.0)
    second = cache.plan(blocks, now=2.0)
    assert (second.cache_read_input_tokens, second.cache_creation_input_tokens) == (2000, 0)
    assert second.input_tokens == 50
    assert second.usage(7)["output_tokens"] == 7


def test_concurrent_requests_do_not_see_an_uncommitted_write() -> None:
    cache = PromptCache()
    blocks = _blocks([2000, 50], {0: "5m"})
    first = cache.plan(blocks, now=0.0)
    concurrent = cache.plan(blocks, now=0.1)  # sent before the first one's response began
    assert concurrent.cache_read_input_tokens == 0
    assert concurrent.cache_creation_input_tokens == 2000
    cache.commit(first, now=0.5)
    assert cache.plan(blocks, now=0.6).cache_read_input_tokens == 2000


def test_prefix_shorter_than_the_minimum_caches_nothing() -> None:
    assert min_cacheable_tokens("claude-opus-5") == 1024
    assert min_cacheable_tokens("claude-haiku-4-5") == 2048
    cache = PromptCache()
    plan = cache.plan(_blocks([1000, 10], {0: "5m"}), now=0.0)
    assert plan.cache_creation_input_tokens == 0
    assert plan.input_tokens == 1010
    haiku = cache.plan(_blocks([1500, 10], {0: "5m"}), now=0.0, model="claude-haiku-4-5")
    assert haiku.cache_creation_input_tokens == 0


def test_at_most_four_breakpoints_and_long_ttls_first() -> None:
    cache = PromptCache()
    with pytest.raises(CacheRuleError, match="maximum of 4"):
        cache.plan(_blocks([10] * 5, dict.fromkeys(range(5), "5m")), now=0.0)
    with pytest.raises(CacheRuleError, match="1h"):
        cache.plan(_blocks([2000, 10], {0: "5m", 1: "1h"}), now=0.0)
    with pytest.raises(CacheRuleError, match="ttl"):
        cache.plan(_blocks([2000], {0: "10m"}), now=0.0)


def test_two_breakpoints_split_creation_by_ttl_and_the_longest_hit_wins() -> None:
    cache = PromptCache()
    blocks = _blocks([1500, 600, 30], {0: "1h", 1: "5m"})
    plan = cache.plan(blocks, now=0.0)
    assert plan.ephemeral_1h_input_tokens == 1500
    assert plan.ephemeral_5m_input_tokens == 600
    assert plan.input_tokens == 30
    assert plan.relative_cost() == pytest.approx(30 + 2.0 * 1500 + 1.25 * 600)
    cache.commit(plan, now=0.0)
    again = cache.plan(blocks, now=1.0)
    assert again.cache_read_input_tokens == 2100
    assert again.relative_cost() == pytest.approx(30 + 0.1 * 2100)


def test_a_moved_breakpoint_reads_the_earlier_entry_within_the_lookback() -> None:
    cache = PromptCache()
    turn1 = _blocks([2000, 40, 40], {2: "5m"})
    cache.commit(cache.plan(turn1, now=0.0), now=0.0)
    # The conversation grew by three blocks; the breakpoint moved to the new last block.
    turn2 = _blocks([2000, 40, 40, 40, 40, 40], {5: "5m"})
    plan = cache.plan(turn2, now=1.0)
    assert plan.cache_read_input_tokens == 2080
    assert plan.cache_creation_input_tokens == 120
    # Beyond the lookback window the earlier entry is not found.
    far = _blocks([2000, 40, 40] + [1] * LOOKBACK_BLOCKS, {2 + LOOKBACK_BLOCKS: "5m"})
    assert cache.plan(far, now=1.0).cache_read_input_tokens == 0


def test_entries_expire_after_their_ttl_and_hits_refresh_it() -> None:
    cache = PromptCache()
    blocks = _blocks([2000, 5], {0: "5m"})
    cache.commit(cache.plan(blocks, now=0.0), now=0.0)
    assert cache.plan(blocks, now=290.0).cache_read_input_tokens == 2000  # refreshed to 590
    assert cache.plan(blocks, now=580.0).cache_read_input_tokens == 2000
    assert cache.plan(blocks, now=2000.0).cache_read_input_tokens == 0
    long = _blocks([2000, 5], {0: "1h"}, tag="x")
    cache.commit(cache.plan(long, now=0.0), now=0.0)
    assert cache.plan(long, now=3000.0).cache_read_input_tokens == 2000


# -- OpenAI ----------------------------------------------------------------------


def test_openai_caches_from_1024_tokens_in_128_token_steps() -> None:
    assert cacheable_lengths(1023) == []
    assert cacheable_lengths(1280) == [1024, 1152, 1280]
    cache = OpenAIPromptCache()
    short = list(range(1000))
    cache.commit(cache.lookup(short, key=None, retention=None, now=0.0), now=0.0)
    assert cache.lookup(short, key=None, retention=None, now=1.0).cached_tokens == 0
    prompt = list(range(2000))
    cache.commit(cache.lookup(prompt, key=None, retention=None, now=0.0), now=0.0)
    longer = [*prompt[:1500], *range(9000, 9700)]
    assert cache.lookup(longer, key=None, retention=None, now=1.0).cached_tokens == 1408


def test_openai_routes_by_prompt_cache_key_and_overflows_above_the_rate() -> None:
    cache = OpenAIPromptCache(machines=64)
    prompt = list(range(3000))
    cache.commit(cache.lookup(prompt, key="a", retention=None, now=0.0), now=0.0)
    assert cache.lookup(prompt, key="a", retention=None, now=1.0).cached_tokens == 2944
    home_a = cache.lookup(prompt, key="a", retention=None, now=1.0).machine
    other = cache.lookup(prompt, key="b", retention=None, now=1.0)
    assert other.cached_tokens == 0 or other.machine == home_a  # another key, another machine
    # More than 15 a minute for one prefix and key: some go to other machines.
    machines = {cache.lookup(prompt, key="c", retention=None, now=2.0).machine for _ in range(40)}
    assert len(machines) > 1


def test_openai_retention() -> None:
    cache = OpenAIPromptCache()
    prompt = list(range(2000))
    cache.commit(cache.lookup(prompt, key="k", retention=None, now=0.0), now=0.0)
    assert cache.lookup(prompt, key="k", retention=None, now=700.0).cached_tokens == 0
    cache.commit(cache.lookup(prompt, key="k", retention="24h", now=0.0), now=0.0)
    assert cache.lookup(prompt, key="k", retention="24h", now=7200.0).cached_tokens == 1920
    with pytest.raises(ValueError, match="prompt_cache_retention"):
        cache.lookup(prompt, key="k", retention="1w", now=0.0)


def test_hosted_option_round_trips_through_the_command_line() -> None:
    from langgraph_batch.emulator.cli import build_parser, config_from_args
    from langgraph_batch.emulator.config import EmulatorConfig

    for hosted in ("anthropic", "openai", None):
        cfg = EmulatorConfig(hosted=hosted)
        assert config_from_args(build_parser().parse_args(cfg.to_argv())).hosted == hosted
    with pytest.raises(ValueError, match="hosted"):
        EmulatorConfig(hosted="gemini")  # type: ignore[arg-type]


def test_a_tool_result_is_the_same_prefix_with_or_without_its_breakpoint() -> None:
    from langgraph_batch.emulator._anthropic_api import parse

    def body(result: object) -> dict[str, object]:
        return {
            "model": "claude-sonnet-5",
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": result}],
                },
            ],
        }

    marked = [{"type": "text", "text": "42", "cache_control": {"type": "ephemeral"}}]
    plain, cached = parse(body("42")).blocks, parse(body(marked)).blocks
    assert [b.digest for b in plain] == [b.digest for b in cached]
    assert plain[-1].ttl is None
