"""One parser for every comma-list option: canonical names, aliases, 'all', clear refusals."""

import pytest

from gpucheck.core.choices import parse_choices


def test_order_repeats_case_and_aliases():
    got = parse_choices(["BF16,fp32", "bfloat16", " "], ["fp32", "bf16"], what="dtype", aliases={"bfloat16": "bf16"})
    assert got == ["bf16", "fp32"]


def test_all_and_dash_underscore():
    names = ["zeros", "walking-ones", "random"]
    assert parse_choices("walking_ones,all", names, what="pattern", dash_underscore=True, allow_all=True) == \
        ["walking-ones", "zeros", "random"]


@pytest.mark.parametrize("value, words", [("fp64", "unknown dtype 'fp64' (use fp32, bf16)"),
                                          (",", "no dtype given"), ("all", "unknown dtype 'all'")])
def test_refusals_name_the_choices(value, words):
    class Bad(ValueError):
        pass

    with pytest.raises(Bad, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_choices(value, ["fp32", "bf16"], what="dtype", error=Bad)
