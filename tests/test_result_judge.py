"""The rule engine (result.Rule, evaluate, outcome, settle, and judge for thresholds built at run
time): limits and actions by key, a finding named once, rules turned off by a None limit, skips
only of what is not supported; a metric that cannot be compared (NaN, text against a limit, a NaN
limit) is never a pass, and never a crash."""

from __future__ import annotations

import math

import pytest

from gpucheck.core.result import Action, Basis, Key, Result, Rule, Status, Threshold, evaluate, judge, outcome, settle

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


# -- the rule form and its engine (result.Rule, result.evaluate) -------------------------------------
RULES = (
    Rule("temp_c", ">", Key("temp_fail_c"), Status.FAIL, Action.DRAIN, "hot: {value} C over {limit} C ({detail})", "C"),
    Rule("temp_c", ">", Key("temp_warn_c"), Status.WARN, Action.INVESTIGATE, "warm: {value} C ({detail})", "C"),
    Rule("errors", ">", 0, Status.WARN, Key("errors_action"), "{errors} error(s) on {where}", "count"),
)
LIMITS = {"temp_fail_c": 90, "temp_warn_c": 80, "errors_action": Action.RESET_GPU}


def test_limits_and_actions_come_from_the_checks_parameters_by_key():
    r = evaluate("t", RULES, {"temp_c": 85, "errors": 2}, limits=LIMITS, facts={"where": "gpu0"}, units={"temp_c": "C"})
    assert [(t.metric, t.limit, t.status, t.action) for t in r.thresholds] == [
        ("temp_c", 90, Status.FAIL, Action.DRAIN), ("temp_c", 80, Status.WARN, Action.INVESTIGATE),
        ("errors", 0, Status.WARN, Action.RESET_GPU)]
    assert (r.status, r.action) == (Status.WARN, Action.RESET_GPU)  # the strongest among the warns
    assert r.summary == "warm: 85 C (temp_c=85 C > 80 C); 2 error(s) on gpu0"
    assert outcome(r.thresholds, r.metrics) == (r.status, r.action)


def test_a_finding_is_named_once_by_its_most_severe_rule_and_the_most_severe_first():
    r = evaluate("t", RULES, {"temp_c": 95, "errors": 1}, limits=LIMITS, facts={"where": "gpu1"})
    assert (r.status, r.action) == (Status.FAIL, Action.DRAIN)
    assert r.summary == "hot: 95 C over 90 C (temp_c=95 C > 90 C); 1 error(s) on gpu1"


def test_a_limit_of_none_turns_its_rule_off_and_it_is_not_listed():
    r = evaluate("t", RULES, {"temp_c": 95, "errors": 0}, limits={**LIMITS, "temp_fail_c": None})
    assert [t.limit for t in r.thresholds] == [80, 0] and r.status == Status.WARN


def test_findings_on_one_metric_can_be_named_apart_and_a_none_fact_names_nothing():
    rules = (Rule("rate", ">", 100, Status.FAIL, cause="{fail_links} over 100", finding="fail"),
             Rule("rate", ">", 1, Status.WARN, cause="{warn_links} over 1", finding="warn"))
    both = evaluate("t", rules, {"rate": 200}, facts={"fail_links": "link 1", "warn_links": "link 0"}, prefix="GPU 0: ")
    assert both.summary == "GPU 0: link 1 over 100; link 0 over 1"
    one = evaluate("t", rules, {"rate": 200}, facts={"fail_links": "link 1", "warn_links": None}, prefix="GPU 0: ")
    assert one.summary == "GPU 0: link 1 over 100" and one.status == Status.FAIL


def test_a_skip_only_when_nothing_the_rules_judge_is_supported():
    assert evaluate("t", RULES, {"temp_c": None, "errors": None}, limits=LIMITS, skip="no sensors").status == Status.SKIP
    r = evaluate("t", RULES, {"temp_c": 20, "errors": None}, limits=LIMITS, skip="no sensors", ok_summary="cool")
    assert (r.status, r.summary) == (Status.PASS, "cool")


def test_the_engine_keeps_the_unjudgeable_guarantees():
    r = evaluate("t", RULES, {"temp_c": math.nan, "errors": 3}, limits=LIMITS, facts={"where": "x"})
    assert (r.status, r.action) == (Status.ERROR, Action.NONE)
    assert r.summary == "could not judge temp_c: the value is not a number (NaN); 3 error(s) on x"
    r = evaluate("t", RULES, {"temp_c": 99, "errors": "many"}, limits=LIMITS, facts={"where": "x"})
    assert (r.status, r.action) == (Status.FAIL, Action.DRAIN) and r.evidence == [
        "could not judge errors: the value 'many' is not a number"]


def test_a_cause_naming_a_field_nobody_gave_is_a_loud_error():
    with pytest.raises(KeyError):
        evaluate("t", RULES, {"temp_c": 20, "errors": 1}, limits=LIMITS)  # no fact "where"


def test_settle_applies_what_could_not_be_examined():
    r = evaluate("t", RULES, {"temp_c": 20, "errors": 0}, limits=LIMITS)
    r.unjudged["fan"] = Status.WARN
    assert (settle(r).status, r.action) == (Status.WARN, Action.INVESTIGATE)
    r.unjudged["sensor"] = Status.ERROR
    assert (settle(r).status, r.action) == (Status.ERROR, Action.NONE)
    hot = evaluate("t", RULES, {"temp_c": 99, "errors": 0}, limits=LIMITS)
    hot.unjudged["sensor"] = Status.ERROR
    assert (settle(hot).status, hot.action) == (Status.FAIL, Action.DRAIN)  # a fail found stands
    lost = Result("t", Status.FAIL, "GPU lost", action=Action.REBOOT, basis=Basis.GPU_STATE)
    lost.unjudged["x"] = Status.ERROR
    assert settle(lost).status == Status.FAIL  # a basis decides its own status
