"""A stranger cycling CurveZMQ keys cannot flood the log: the first few unknown keys are named,
the rest summed up in one line at most every SUMMARY_EVERY_S; every refusal is still reported to
the server's counter. (Through the real ZAP path: tests/unit/wire/test_security.py.)"""

from __future__ import annotations

import logging

import pytest

from rlfleet.common.wire import transport


def test_thousand_unknown_keys_cost_a_few_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    clock = [1000.0]
    counted: list[tuple[str, str]] = []
    allow = transport._Allowlist([], "replay-0", lambda reason, fp: counted.append((reason, fp)),
                                 clock=lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger=transport.log.name):
        for i in range(1000):
            allow.reject("unknown_key", f"{i:012x}")
            clock[0] += 0.01  # 1,000 keys in 10 s
        lines = [r.getMessage() for r in caplog.records]
        assert len(counted) == 1000
        named = [line for line in lines if "fingerprint" in line]
        assert len(named) == transport.KEYS_NAMED
        summaries = [line for line in lines if "more connections" in line]
        assert len(summaries) == 1 and "refused 1 more" in summaries[0], summaries
        clock[0] += transport.SUMMARY_EVERY_S
        allow.reject("unknown_key", "fffffffffff0")
        summaries = [r.getMessage() for r in caplog.records if "more connections" in r.getMessage()]
        assert len(summaries) == 2 and "refused 995 more" in summaries[1], summaries
        for _ in range(3):
            allow.reject("handshake", "")
        assert sum("handshake failed" in r.getMessage() for r in caplog.records) == 1
