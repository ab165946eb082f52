"""The emulator's provider-style rate limits: buckets, 429s and both header spellings."""

from __future__ import annotations

import math
from datetime import datetime

import pytest

from langgraph_batch._rate_headers import parse_rate_headers
from langgraph_batch.emulator import EmulatorConfig
from langgraph_batch.emulator._ratelimit import (
    RateLimited,
    RateLimiter,
    TokenBucket,
    anthropic_headers,
    go_duration,
    openai_headers,
)
from langgraph_batch.emulator.cli import build_parser, config_from_args


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_bucket_refills_continuously_up_to_its_capacity() -> None:
    bucket = TokenBucket(60, window_s=60.0, now=0.0)
    bucket.take(60, 0.0)
    assert bucket.wait_s(1, 0.0) == 1.0
    assert bucket.refill(30.0) == 30.0
    assert bucket.reset_s(30.0) == 30.0
    assert bucket.refill(1000.0) == 60.0  # never above the capacity
    assert bucket.wait_s(61, 1000.0) == math.inf
    bucket.take(-10, 1000.0)  # a refund stops at the capacity
    assert bucket.level == 60.0
    with pytest.raises(ValueError, match="must be > 0"):
        TokenBucket(0, window_s=1.0, now=0.0)


def test_a_request_over_a_limit_is_refused_and_charged_nothing() -> None:
    clock = Clock()
    limiter = RateLimiter(requests_per_min=10, tokens_per_min=1000, minute_s=60.0, clock=clock)
    limiter.admit(input_tokens=700, output_tokens=200)
    with pytest.raises(RateLimited) as info:
        limiter.admit(input_tokens=100, output_tokens=100)
    assert info.value.dimension == "tokens"
    assert info.value.retry_after_s == pytest.approx(100 / (1000 / 60))
    snap = limiter.snapshot()
    assert snap["requests"].remaining == 9  # the refused request was not charged
    assert snap["tokens"].remaining == 100


def test_output_is_charged_at_max_tokens_and_settled_to_the_real_count() -> None:
    clock = Clock()
    limiter = RateLimiter(
        tokens_per_min=1000, input_tokens_per_min=800, output_tokens_per_min=300, clock=clock
    )
    ticket = limiter.admit(input_tokens=100, output_tokens=200)
    assert limiter.snapshot()["output_tokens"].remaining == 100
    limiter.settle(ticket, output_tokens=50)
    limiter.settle(ticket, output_tokens=50)  # once only
    snap = limiter.snapshot()
    assert snap["output_tokens"].remaining == 250
    assert snap["tokens"].remaining == 850
    assert snap["input_tokens"].remaining == 700
    ticket = limiter.admit(input_tokens=0, output_tokens=0)
    limiter.settle(ticket, output_tokens=400)  # more than charged: the bucket goes below 0
    assert limiter.snapshot()["output_tokens"].remaining == 0
    with pytest.raises(RateLimited):
        limiter.admit(input_tokens=1, output_tokens=1)


def test_a_cost_above_the_limit_waits_a_minute_at_most() -> None:
    limiter = RateLimiter(tokens_per_min=100, minute_s=2.0, clock=Clock())
    with pytest.raises(RateLimited) as info:
        limiter.admit(input_tokens=500)
    assert info.value.retry_after_s == 2.0


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.02, "20ms"), (1, "1s"), (1.5, "1.5s"), (360, "6m0s"), (86.4, "1m26.4s")],
)
def test_go_durations(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text
    assert go_duration(3 * 3600 + 1) == "3h0m1s"


def test_openai_headers_round_trip_through_the_client_parser() -> None:
    limiter = RateLimiter(requests_per_min=60, tokens_per_min=150_000, clock=Clock())
    limiter.admit(input_tokens=16, output_tokens=0)
    headers = openai_headers(limiter.snapshot(), retry_after_s=0.25)
    assert headers["x-ratelimit-limit-requests"] == "60"
    assert headers["x-ratelimit-remaining-requests"] == "59"
    assert headers["x-ratelimit-reset-requests"] == "1s"
    assert headers["x-ratelimit-remaining-tokens"] == "149984"
    assert headers["x-ratelimit-reset-tokens"] == "6ms"
    assert headers["retry-after"] == "1"
    assert headers["retry-after-ms"] == "250"
    readings = parse_rate_headers(headers)
    assert readings["tokens"].limit == 150_000
    assert readings["tokens"].reset_s == pytest.approx(0.006)
    assert readings["requests"].remaining == 59


def test_anthropic_headers_state_rfc3339_resets_and_the_tightest_token_limit() -> None:
    limiter = RateLimiter(
        requests_per_min=50,
        input_tokens_per_min=40_000,
        output_tokens_per_min=8_000,
        clock=Clock(),
    )
    limiter.admit(input_tokens=4_000, output_tokens=4_000)
    wall = 1_700_000_000.0
    headers = anthropic_headers(limiter.snapshot(), wall_now=wall, retry_after_s=2.5)
    assert headers["anthropic-ratelimit-requests-limit"] == "50"
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == "36000"
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == "4000"
    # Output is the tighter one (half left against nine tenths).
    assert headers["anthropic-ratelimit-tokens-limit"] == "8000"
    reset = headers["anthropic-ratelimit-output-tokens-reset"]
    assert reset.endswith("Z")
    assert datetime.fromisoformat(reset.replace("Z", "+00:00")).timestamp() == wall + 30.0
    assert headers["retry-after"] == "3"
    readings = parse_rate_headers(headers, wall_now=wall)
    assert set(readings) == {"requests", "input_tokens", "output_tokens"}
    assert readings["output_tokens"].reset_s == pytest.approx(30.0)


def test_the_limits_are_options_of_the_config_and_the_cli() -> None:
    cfg = EmulatorConfig(rate_limit_rpm=60, rate_limit_tpm=1000, rate_limit_otpm=10)
    argv = cfg.to_argv()
    assert "--rate-limit-rpm=60" in argv
    assert "--rate-limit-itpm" not in " ".join(argv)
    again = config_from_args(build_parser().parse_args(argv))
    assert again.rate_limit_tpm == 1000
    assert again.rate_limit_otpm == 10
    assert again.rate_limit_itpm is None
    with pytest.raises(ValueError, match="rate_limit_tpm must be >= 1"):
        EmulatorConfig(rate_limit_tpm=0)
    with pytest.raises(ValueError, match="per minute must be an integer"):
        RateLimiter(requests_per_min=0)


def test_the_server_charges_a_body_and_answers_429_in_either_spelling() -> None:
    from langgraph_batch.emulator._http import RequestError
    from langgraph_batch.emulator._serving import Serving

    server = Serving(EmulatorConfig(rate_limit_rpm=2, rate_limit_itpm=1000, rate_limit_otpm=100))
    headers: dict[str, str] = {}
    ticket = server.admit({"max_tokens": 60}, 10, headers, style="anthropic")
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == "40"
    server.settle(ticket, 5)
    headers = {}
    server.admit({}, 10, headers)  # no max_tokens: output charged at the end only
    assert headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(RequestError) as info:
        server.admit({}, 10, {})
    assert info.value.status == 429
    assert info.value.headers["retry-after"] == "30"
    assert server.rate_limited == 1
    assert Serving(EmulatorConfig()).admit({}, 10, {}) is None  # no limits: nothing charged
