"""`result.judge`: a metric that cannot be compared (NaN, text against a limit, a NaN limit) is
never a pass, and never a crash."""

from __future__ import annotations

import math

from gpucheck.result import Action, Status, Threshold, judge

T = [Threshold("temp_c", ">", 90, Status.FAIL), Threshold("temp_c", ">", 80, Status.WARN),
     Threshold("errors", ">", 0, Status.WARN)]


def test_nan_or_text_metric_is_an_error_naming_it():
    for bad in (math.nan, "hot", [1]):
        r = judge("t", T, {"temp_c": bad, "errors": 0}, ok_summary="fine")
        assert (r.status, r.action) == (Status.ERROR, Action.NONE), bad
        assert r.summary.startswith("could not judge temp_c: the value")


def test_a_fail_found_from_what_could_be_judged_stands():
    r = judge("t", [Threshold("errors", ">", 0, Status.FAIL, "count"), *T[:2]], {"temp_c": math.nan, "errors": 3},
              actions={"errors": Action.RESET_GPU})
    assert (r.status, r.action) == (Status.FAIL, Action.RESET_GPU)
    assert r.evidence == ["could not judge temp_c: the value is not a number (NaN)"]


def test_a_warn_with_an_unjudged_metric_is_an_error_that_keeps_the_warning():
    r = judge("t", T, {"temp_c": math.nan, "errors": 4})
    assert r.status == Status.ERROR
    assert r.summary == "could not judge temp_c: the value is not a number (NaN); errors=4 > 0"


def test_a_nan_limit_is_an_error_and_none_is_still_not_supported():
    r = judge("t", [Threshold("x", ">", math.nan, Status.FAIL)], {"x": 5})
    assert r.status == Status.ERROR and "the limit nan is not a number" in r.summary
    assert judge("t", T, {"temp_c": None, "errors": None}, ok_summary="fine").status == Status.PASS
    assert judge("t", [Threshold("on", "==", False, Status.FAIL)], {"on": True}).status == Status.PASS
    assert not Threshold("x", ">", 1, Status.FAIL).violated_by(math.nan)
