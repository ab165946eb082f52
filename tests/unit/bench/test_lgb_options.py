"""The langgraph-batch contender's `--lgb-option policy=...` (JSON) over the default policy."""

from __future__ import annotations

import warnings

from langgraph_batch import RetryPolicy
from langgraph_batch.bench.contenders.lgb import make_llm

JOB = {"max_tokens": 16, "llm_url": "http://127.0.0.1:9", "model": "m", "flavor": "vllm"}


def test_policy_option_takes_a_retry_dict_and_keeps_the_other_defaults() -> None:
    job = JOB | {"lgb_options": {"policy": {"priority": "las", "retry": {"max_attempts": 7}}}}
    llm = make_llm(job)
    assert llm.policy.priority == "las"
    assert llm.policy.retry == RetryPolicy(max_attempts=7)
    assert llm.policy.gather_window_s == make_llm(JOB).default_policy().gather_window_s


def test_policy_option_takes_a_deprecated_keyword_with_its_warning() -> None:
    job = JOB | {"lgb_options": {"policy": {"max_retries": 5}}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = make_llm(job)
    assert llm.policy.retry.max_attempts == 6
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
