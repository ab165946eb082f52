"""Rate budgets: the header parser, the pure pacer (explicit `now`), the policy and the gate."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from langgraph_batch import _rate_budget
from langgraph_batch._rate_budget import (
    RateLimitPolicy,
    RatePacer,
    RateTicket,
    existing_pacer,
    forget_pacers,
    observe_headers,
    pacer_for,
    request_costs,
    sending,
)
from langgraph_batch._rate_headers import (
    RateReading,
    has_rate_headers,
    parse_go_duration,
    parse_rate_headers,
)
from langgraph_batch.backends import OpenAICompatibleBackend
from langgraph_batch.backends.base import ChatRequest
from langgraph_batch.scheduler import BatchPolicy, Scheduler
from tests.fakes.http import Recorder, completion

# ----------------------------------------------------------------------------- headers


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("6m0s", 360.0), ("1s", 1.0), ("20ms", 0.02), ("1m26.4s", 86.4), ("0s", 0.0), ("2h", 7200.0)],
)
def test_go_durations_are_read(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5", "1x", "s1", "1s junk"])
def test_what_is_not_a_go_duration_is_none(text: str) -> None:
    assert parse_go_duration(text) is None


def test_openai_headers_are_read_in_any_case() -> None:
    headers = {
        "X-RateLimit-Limit-Requests": "60",
        "X-RateLimit-Remaining-Requests": "59",
        "X-RateLimit-Reset-Requests": "1s",
        "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    assert has_rate_headers(headers)
    readings = parse_rate_headers(headers)
    assert readings == {
        "requests": RateReading(60, 59, 1.0),
        "tokens": RateReading(150_000, 149_984, 360.0),
    }


def test_anthropic_headers_are_read_against_the_wall_clock() -> None:
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": "2025-10-25T12:00:01Z",
        "anthropic-ratelimit-input-tokens-limit": "40000",
        "anthropic-ratelimit-input-tokens-remaining": "39000",
        "anthropic-ratelimit-input-tokens-reset": "2025-10-25T12:00:01.500Z",
        "anthropic-ratelimit-output-tokens-limit": "8000",
        "anthropic-ratelimit-output-tokens-remaining": "8000",
        "anthropic-ratelimit-output-tokens-reset": "2025-10-25T12:00:00Z",
        "anthropic-ratelimit-tokens-limit": "8000",
        "anthropic-ratelimit-tokens-remaining": "8000",
    }
    from datetime import UTC, datetime

    wall = datetime(2025, 10, 25, 12, 0, 0, tzinfo=UTC).timestamp()
    readings = parse_rate_headers(headers, wall_now=wall)
    assert set(readings) == {"requests", "input_tokens", "output_tokens"}  # tokens: the tightest
    assert readings["requests"].reset_s == 1.0
    assert readings["input_tokens"].reset_s == 1.5
    assert readings["output_tokens"].reset_s == 0.0
    # Only the combined spelling: it is read as `tokens`.
    only = {"anthropic-ratelimit-tokens-limit": "100", "anthropic-ratelimit-tokens-remaining": "7"}
    assert parse_rate_headers(only)["tokens"] == RateReading(100, 7, None)


def test_malformed_headers_are_skipped_never_raised() -> None:
    headers = {
        "x-ratelimit-limit-requests": "lots",
        "x-ratelimit-remaining-requests": "1",
        "x-ratelimit-limit-tokens": "100",
        "x-ratelimit-remaining-tokens": "500",  # more than the limit: clamped
        "x-ratelimit-reset-tokens": "later",
        "anthropic-ratelimit-requests-limit": "5",
        "anthropic-ratelimit-requests-remaining": "-1",
        "anthropic-ratelimit-input-tokens-limit": "5",
        "anthropic-ratelimit-input-tokens-remaining": "5",
        "anthropic-ratelimit-input-tokens-reset": "yesterday-ish",
    }
    readings = parse_rate_headers(headers)
    assert readings["tokens"] == RateReading(100, 100, None)
    assert "requests" not in readings
    assert readings["input_tokens"].reset_s is None
    assert not has_rate_headers({"content-type": "application/json"})


# ----------------------------------------------------------------------------- the pacer


def _pacer(**policy: float | bool) -> RatePacer:
    pacer = RatePacer("test")
    pacer.configure(RateLimitPolicy(probe=False, headroom=1.0, **policy), now=0.0)  # type: ignore[arg-type]
    return pacer


def test_a_burst_goes_out_spaced_at_the_refill_rate_in_the_order_it_asked() -> None:
    pacer = _pacer(requests_per_min=60)
    delays = [pacer.reserve({"requests": 1.0}, now=0.0)[1] for _ in range(63)]
    assert delays[:60] == [0.0] * 60  # the full bucket at once
    assert delays[60:] == pytest.approx([1.0, 2.0, 3.0])  # then one a second


def test_every_dimension_must_pay_and_the_slowest_decides() -> None:
    pacer = _pacer(requests_per_min=600, tokens_per_min=1200)
    costs = {"requests": 1.0, "tokens": 600.0, "input_tokens": 500.0}
    assert pacer.reserve(costs, now=0.0)[1] == 0.0
    assert pacer.reserve(costs, now=0.0)[1] == 0.0
    assert pacer.reserve(costs, now=0.0)[1] == pytest.approx(30.0)  # 600 tokens at 20/s
    assert set(pacer.limits()) == {"requests", "tokens"}


def test_a_request_larger_than_the_bucket_waits_for_a_full_bucket() -> None:
    pacer = _pacer(tokens_per_min=100)
    pacer.reserve({"tokens": 100.0}, now=0.0)
    assert pacer.reserve({"tokens": 500.0}, now=0.0)[1] == pytest.approx(60.0)


def test_released_bookings_come_back_and_settled_ones_are_corrected() -> None:
    pacer = _pacer(tokens_per_min=60)
    ticket, _ = pacer.reserve({"tokens": 60.0, "input_tokens": 40.0}, now=0.0)
    assert ticket is not None
    pacer.release(ticket, now=0.0)  # a 429: the server charged nothing
    pacer.release(ticket, now=0.0)  # once only
    ticket, delay = pacer.reserve({"tokens": 60.0}, now=0.0)
    assert delay == 0.0
    assert ticket is not None
    pacer.settle(ticket, {"tokens": 30.0}, now=0.0)  # used half: half comes back
    assert pacer.reserve({"tokens": 30.0}, now=0.0)[1] == 0.0
    assert pacer.reserve({"tokens": 1.0}, now=0.0)[1] == pytest.approx(1.0)


def test_input_estimates_are_calibrated_on_what_the_server_counted() -> None:
    pacer = _pacer(input_tokens_per_min=6000)
    costs = {"requests": 1.0, "input_tokens": 100.0, "output_tokens": 10.0, "tokens": 110.0}
    ticket, _ = pacer.reserve(costs, now=0.0)
    assert ticket is not None
    assert pacer.input_scale() == 1.0
    pacer.settle(ticket, {"input_tokens": 60.0, "output_tokens": 10.0}, now=0.0)
    assert pacer.input_scale() == pytest.approx(0.6)
    ticket, _ = pacer.reserve(costs, now=0.0)
    assert ticket is not None
    assert ticket.costs == {"input_tokens": pytest.approx(60.0)}
    pacer.settle(ticket, {"input_tokens": 300.0}, now=0.0)  # never above the generous estimate
    assert pacer.input_scale() == 1.0
    ticket, _ = pacer.reserve(costs, now=0.0)
    assert ticket is not None
    pacer.settle(ticket, None, now=0.0)  # no usage: the booking stands, nothing learned
    assert pacer.input_scale() == 1.0
    ticket, _ = pacer.reserve(costs, now=0.0)
    assert ticket is not None
    pacer.settle(ticket, {"input_tokens": 10.0}, now=0.0, calibrate=False)  # a batch's share
    assert pacer.input_scale() == 1.0


def test_calibration_is_kept_per_number_of_messages() -> None:
    pacer = _pacer(input_tokens_per_min=6000)
    one, _ = pacer.reserve({"input_tokens": 100.0}, now=0.0, shape=1)
    three, _ = pacer.reserve({"input_tokens": 100.0}, now=0.0, shape=3)
    assert one is not None
    assert three is not None
    pacer.settle(one, {"input_tokens": 70.0}, now=0.0)
    assert pacer.input_scale(3) == pytest.approx(0.7)  # none of its own yet: any shape's
    pacer.settle(three, {"input_tokens": 90.0}, now=0.0)
    assert pacer.input_scale(1) == pytest.approx(0.7)
    assert pacer.input_scale(3) == pytest.approx(0.9)
    assert pacer.input_scale(5) == pytest.approx(0.9)  # unseen: the most generous seen


def test_every_learned_limit_shares_the_minute_the_busiest_one_shows() -> None:
    pacer = RatePacer("minute")
    pacer.configure(RateLimitPolicy(probe=False, headroom=1.0), now=0.0)
    # Tokens show a 2 s minute (300 of 1500 used, full in 0.4 s); requests, barely
    # used, say nothing about it but refill over the same minute.
    pacer.observe(
        {"tokens": RateReading(1500, 1200, 0.4), "requests": RateReading(6000, 5999, 0.0003)},
        now=0.0,
    )
    for _ in range(5999):
        pacer.reserve({"requests": 1.0}, now=0.0)
    assert pacer.reserve({"requests": 1.0}, now=0.0)[1] == pytest.approx(2.0 / 6000)


def test_the_headers_teach_limits_and_the_minute_and_lower_what_is_left() -> None:
    pacer = RatePacer("learn")
    pacer.configure(RateLimitPolicy(probe=False, headroom=1.0), now=0.0)
    assert pacer.idle
    # 1500 tokens a "minute" of 2 s: 300 used, full again in 0.4 s.
    pacer.observe({"tokens": RateReading(1500, 1200, 0.4)}, now=0.0)
    assert not pacer.idle
    assert pacer.paces_tokens
    assert pacer.limits() == {"tokens": 1500}
    big, delay = pacer.reserve({"tokens": 1200.0}, now=0.0)
    assert delay == 0.0
    small, delay = pacer.reserve({"tokens": 75.0}, now=0.0)
    assert delay == pytest.approx(0.1)  # 750 per second
    # A reading never raises the bucket (it misses requests still on their way) ...
    pacer.observe({"tokens": RateReading(1500, 1500, None)}, now=0.1)
    one, delay = pacer.reserve({"tokens": 1.0}, now=0.1)
    assert delay > 0
    for ticket in (big, small, one):
        assert ticket is not None
        pacer.settle(ticket, None, now=1.0)
    # ... but lowers it to what the server has left.
    pacer.observe({"tokens": RateReading(1500, 0, 2.0)}, now=10.0)
    assert pacer.reserve({"tokens": 150.0}, now=10.0)[1] == pytest.approx(0.2)


def test_a_reading_counts_bookings_not_yet_sent() -> None:
    pacer = RatePacer("unsent")
    pacer.configure(RateLimitPolicy(probe=False, headroom=1.0, tokens_per_min=60), now=0.0)
    first, _ = pacer.reserve({"tokens": 60.0}, now=0.0)
    assert first is not None
    pacer.mark_sent(first, now=0.0)
    future, delay = pacer.reserve({"tokens": 30.0}, now=0.0)  # goes at 30 s
    assert future is not None
    assert delay == pytest.approx(30.0)
    with sending(pacer, first):  # the reading answers the first request
        pacer.observe({"tokens": RateReading(60, 0, 60.0)}, now=0.0)
    assert pacer.reserve({"tokens": 1.0}, now=0.0)[1] == pytest.approx(31.0)


def _three_booked() -> tuple[RatePacer, list[RateTicket]]:
    # 60 tokens a minute (1 a second), three requests of 20 booked at 0:
    # a sent at 0, b sent at 1, c not sent yet.
    pacer = RatePacer("in-flight")
    pacer.configure(RateLimitPolicy(probe=False, headroom=1.0, tokens_per_min=60), now=0.0)
    tickets = []
    for _ in range(3):
        ticket, delay = pacer.reserve({"tokens": 20.0}, now=0.0)
        assert ticket is not None
        assert delay == 0.0
        tickets.append(ticket)
    pacer.mark_sent(tickets[0], now=0.0)
    pacer.mark_sent(tickets[1], now=1.0)
    return pacer, tickets


def test_a_reading_leaves_out_what_was_sent_after_the_request_it_answers() -> None:
    pacer, (a, b, c) = _three_booked()
    # a's answer arrives at 2 s; the server took its reading when it admitted a
    # (at 0): 60 - 20 = 40 left. b and c are not in it: 40 - 40 = 0 left, while
    # the bucket has refilled 2 tokens since 0 (the reading lowers it to 0).
    with sending(pacer, a):
        pacer.observe({"tokens": RateReading(60, 40, 20.0)}, now=2.0)
    assert (a.synced, b.synced, c.synced) == (True, False, False)
    assert pacer.reserve({"tokens": 1.0}, now=2.0)[1] == pytest.approx(1.0)


def test_a_reading_that_answers_an_unknown_request_counts_every_booking_not_counted() -> None:
    pacer, (a, b, c) = _three_booked()
    # The safe side: a, b and c all left out (a counted twice): 40 - 60 = -20.
    pacer.observe({"tokens": RateReading(60, 40, 20.0)}, now=2.0)
    assert (a.synced, b.synced, c.synced) == (False, False, False)
    assert pacer.reserve({"tokens": 1.0}, now=2.0)[1] == pytest.approx(21.0)


def test_explicit_limits_are_kept_and_only_lowered() -> None:
    pacer = RatePacer("explicit")
    pacer.configure(RateLimitPolicy(probe=False, headroom=1.0, tokens_per_min=600), now=0.0)
    pacer.observe({"tokens": RateReading(100_000, 100_000, None)}, now=0.0)
    assert pacer.limits() == {"tokens": 600}
    pacer.configure(RateLimitPolicy(probe=False, tokens_per_min=6000), now=0.0)  # higher: ignored
    assert pacer.limits() == {"tokens": 600}
    pacer.configure(RateLimitPolicy(probe=False, headroom=1.0, tokens_per_min=60), now=0.0)
    assert pacer.limits() == {"tokens": 60}


def test_the_probe_holds_the_burst_until_the_first_answer() -> None:
    pacer = RatePacer("probe")
    pacer.configure(RateLimitPolicy(), now=0.0)
    assert pacer.paces_tokens
    probe, delay = pacer.reserve({"requests": 1.0}, now=0.0)
    assert probe is not None
    assert probe.probe
    assert delay == 0.0
    held, retry = pacer.reserve({"requests": 1.0}, now=0.0)
    assert held is None
    assert retry > 0
    pacer.release(probe, now=0.01)  # refused: the next request probes again
    probe, _ = pacer.reserve({"requests": 1.0}, now=0.01)
    assert probe is not None
    assert probe.probe
    pacer.observe({}, now=0.02)  # answered without headers: nothing to pace
    assert pacer.idle
    ticket, delay = pacer.reserve({"requests": 1.0}, now=0.02)
    assert ticket is not None
    assert delay == 0.0


def test_a_budget_that_ignores_headers_and_has_no_limits_is_idle() -> None:
    pacer = RatePacer("off")
    pacer.configure(RateLimitPolicy(follow_headers=False), now=0.0)
    pacer.observe({"tokens": RateReading(10, 0, 1.0)}, now=0.0)
    assert pacer.idle


def test_pacers_are_shared_by_key_and_never_across_keys() -> None:
    forget_pacers()
    a = pacer_for("OpenAICompatibleBackend:https://api.example#aaaa")
    assert pacer_for("OpenAICompatibleBackend:https://api.example#aaaa") is a
    b = pacer_for("OpenAICompatibleBackend:https://api.example#bbbb")
    assert b is not a
    assert "api.example" not in repr(a)  # a digest, never the key
    assert existing_pacer("never-made") is None
    observe_headers("never-made", {"x-ratelimit-limit-requests": "1"})  # no pacer: ignored
    observe_headers(
        "OpenAICompatibleBackend:https://api.example#aaaa",
        {"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "9"},
    )
    assert a.limits() == {"requests": 10}
    assert b.limits() == {}
    forget_pacers()


def test_request_costs_estimate_generously_and_book_max_tokens() -> None:
    messages = [{"role": "user", "content": "x" * 400}]
    costs = request_costs(messages, None, {"max_tokens": 32}, output_prior=256)
    assert costs["requests"] == 1
    assert costs["input_tokens"] >= 100  # 400 characters: about 100 tokens, generously
    assert costs["output_tokens"] == 32
    assert costs["tokens"] == costs["input_tokens"] + 32
    assert request_costs(messages, None, {}, output_prior=256)["output_tokens"] == 256
    with_tools = request_costs(messages, [{"name": "t" * 300}], {}, output_prior=0)
    assert with_tools["input_tokens"] > costs["input_tokens"]
    odd = request_costs([{"content": object()}], None, {"max_completion_tokens": 5}, output_prior=0)
    assert odd["output_tokens"] == 5


# ----------------------------------------------------------------------------- the policy


def test_the_policy_validates_and_rides_in_batch_policy() -> None:
    budget = RateLimitPolicy(requests_per_min=500, input_tokens_per_min=30_000)
    assert budget.limits_given() == ["requests_per_min", "input_tokens_per_min"]
    assert BatchPolicy(rate_limit=budget).rate_limit is budget
    assert BatchPolicy().rate_limit is None
    loaded = BatchPolicy.from_dict({"rate_limit": {"tokens_per_min": 1000, "minute_s": 2.0}})
    assert loaded.rate_limit == RateLimitPolicy(tokens_per_min=1000, minute_s=2.0)
    with pytest.raises(ValueError, match="tokens_per_min=0"):
        RateLimitPolicy(tokens_per_min=0)
    with pytest.raises(ValueError, match="minute_s"):
        RateLimitPolicy(minute_s=0)
    with pytest.raises(ValueError, match="headroom"):
        RateLimitPolicy(headroom=1.5)
    with pytest.raises(ValueError, match="output_tokens_prior"):
        RateLimitPolicy(output_tokens_prior=-1)
    with pytest.raises(ValueError, match="must be a RateLimitPolicy"):
        BatchPolicy(rate_limit={"tokens_per_min": 5})  # type: ignore[arg-type]


# ------------------------------------------------------ a cache whose reads the limit leaves out


def test_the_shared_prefix_is_the_tools_and_the_leading_system_messages() -> None:
    from langchain_core.messages import HumanMessage, SystemMessage

    from langgraph_batch.scheduler._pacing import split_prefix

    sys_msg = {"role": "system", "content": "policy " * 100}
    user = {"role": "user", "content": "task"}
    digest, rest = split_prefix([sys_msg, user], None)
    assert digest is not None
    assert rest == [user]
    assert split_prefix([user], None) == (None, [user])
    assert split_prefix([user], [{"name": "t"}])[0] is not None  # tools alone are a prefix
    assert split_prefix([sys_msg, {"role": "user", "content": "other"}], None)[0] == digest
    lc_digest, lc_rest = split_prefix([SystemMessage("p"), HumanMessage("q")], None)
    assert lc_digest is not None
    assert len(lc_rest) == 1


async def test_once_a_prefix_is_written_cache_aware_requests_are_booked_without_it() -> None:
    from langgraph_batch.backends.base import ChatRequest, ChatResponse, Usage
    from langgraph_batch.scheduler._pacing import RateGate

    gate = RateGate(_pacer(input_tokens_per_min=10**9))
    system = {"role": "system", "content": "a long shared policy. " * 400}

    def request(i: int) -> ChatRequest:
        task = {"role": "user", "content": f"task {i}"}
        return ChatRequest(model="m", messages=[system, task], params={"max_tokens": 8})

    first = await gate.wait(request(0))
    assert first is not None
    # The writer's answer: usage that reports cache writes (Anthropic's).
    usage = Usage(
        prompt_tokens=2000, completion_tokens=8, cached_tokens=0, cache_creation_tokens=2000
    )
    gate.done(first, ChatResponse(id="r0", model="m", usage=usage), None)
    assert gate.cache_aware
    second = await gate.wait(request(1))
    assert second is not None
    assert second.raw_input < first.raw_input / 10  # the prefix will be a cache read
    assert second.shape == -2  # a calibration class of its own
    # Counted far beyond its booking: the cache entry expired; the prefix is cold again.
    cold = Usage(
        prompt_tokens=2000, completion_tokens=8, cached_tokens=0, cache_creation_tokens=2000
    )
    gate.done(second, ChatResponse(id="r1", model="m", usage=cold), None)
    third = await gate.wait(request(2))
    assert third is not None
    assert third.raw_input == pytest.approx(first.raw_input, rel=0.01)


async def test_a_cache_that_counts_its_reads_is_booked_in_full() -> None:
    from langgraph_batch.backends.base import ChatRequest, ChatResponse, Usage
    from langgraph_batch.scheduler._pacing import RateGate

    gate = RateGate(_pacer(input_tokens_per_min=10**9))
    system = {"role": "system", "content": "a long shared policy. " * 400}
    req = ChatRequest(model="m", messages=[system, {"role": "user", "content": "t"}], params={})
    first = await gate.wait(req)
    assert first is not None
    # OpenAI's usage: cached tokens, no cache writes reported.
    usage = Usage(prompt_tokens=2000, completion_tokens=8, cached_tokens=1920)
    gate.done(first, ChatResponse(id="r0", model="m", usage=usage), None)
    assert not gate.cache_aware
    second = await gate.wait(req)
    assert second is not None
    assert second.raw_input == first.raw_input


async def test_the_scheduler_names_each_reading_its_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Wiring: the scheduler marks a booking sent around the call, and the
    # transport's hook reads the headers inside it, so `observe` knows which
    # request the reading answers (without that, every reading would fall
    # back to the safe side and no booking would ever be counted).
    forget_pacers()
    seen: list[RateTicket | None] = []
    settled: list[RateTicket] = []
    observe, settle = RatePacer.observe, RatePacer.settle

    def spy_observe(self: RatePacer, readings: Any, now: float) -> None:
        seen.append(_rate_budget._ANSWERING.get())
        observe(self, readings, now)

    def spy_settle(self: RatePacer, ticket: RateTicket, *args: Any, **kw: Any) -> None:
        settled.append(ticket)
        settle(self, ticket, *args, **kw)

    monkeypatch.setattr(RatePacer, "observe", spy_observe)
    monkeypatch.setattr(RatePacer, "settle", spy_settle)
    recorder = Recorder()
    headers = {
        "x-ratelimit-limit-tokens": "100000",
        "x-ratelimit-remaining-tokens": "99000",
        "x-ratelimit-reset-tokens": "1s",
    }
    recorder.handler = lambda request: httpx.Response(200, json=completion(), headers=headers)
    backend = OpenAICompatibleBackend("http://srv:8000/v1", transport=recorder.transport)
    policy = BatchPolicy(rate_limit=RateLimitPolicy(tokens_per_min=100_000, probe=False))
    request = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    async with Scheduler(backend, policy=policy, owns_backend=True) as scheduler:
        for _ in range(3):
            await scheduler.submit(request)
    assert len(seen) == len(settled) == 3
    assert seen == settled  # each reading named the booking of the request it answered
    assert all(t.sent_at is not None for t in settled)
    assert _rate_budget._ANSWERING.get() is None  # reset after each call
