"""One readable line per analysis: the edges as query → key with their tokens, the hook
point and strength (never a direction's values), the metric and its units; and the
knockouts that would leave a query with no key at all, found before they run."""

from __future__ import annotations

import pytest
import torch

from mi_core.interp import KnockoutSpec, SteeringSpec, logit_diff_metric, patching_grid
from mi_core.interp.describe import describe_knockout, describe_steering, visible
from mi_core.interp.knockout import emptied_queries, knockout_hooks

TOKS = ["The", " capital", " of", " France", " is"]


def test_a_knockout_names_layers_heads_and_edges_with_their_tokens():
    spec = KnockoutSpec(layers=range(8, 16), heads=[2], from_positions=[-1], to_positions=[3])
    assert describe_knockout(spec, TOKS) == (
        "layers 8-15, head 2; removed edges query \u2192 key: 4 ' is' \u2192 3 ' France'")
    spec = KnockoutSpec(edges=[(-1, 0), (3, 1)], from_positions=[4],
                        to_positions=list(range(5)))
    assert describe_knockout(spec, TOKS) == (
        "all layers, all heads; removed edges query \u2192 key: 4 ' is' \u2192 0 'The'; "
        "3 ' France' \u2192 1 ' capital'; 4 ' is' \u2192 0-4 ('The' \u2026 ' is')")
    assert describe_knockout(KnockoutSpec(edges=[(-1, 3)])) == (
        "all layers, all heads; removed edges query \u2192 key: -1 \u2192 3")  # no tokens


def test_steering_is_described_by_hook_strength_and_norm_never_its_values():
    v = torch.full((576,), 0.5)
    text = describe_steering(SteeringSpec.residual([6], v, 4.0, positions=[3]), TOKS)
    assert text == ("add 4 \u00d7 direction (576-d, \u2016v\u2016 = 12) to "
                    "blocks.6.hook_resid_pre at position 3 ' France'")
    assert "0.5" not in text and "tensor" not in text
    swept = describe_steering(SteeringSpec.residual([6, 7], v), TOKS, sweep=True)
    assert swept.startswith("add s \u00d7 direction") and "hook_resid_pre of layers 6,7" in swept
    att = describe_steering(SteeringSpec.attention(range(10, 20), [3], [-1], scale=2.5), TOKS)
    assert att == ("attention of query 4 ' is' to key 3 ' France' \u00d7 2.5 (rows "
                   "renormalised), layers 10-19, all heads")


def test_patching_names_its_metric_and_units(model):
    r = patching_grid(model, "hello", "jello", logit_diff_metric(3, 4), layers=[0])
    assert r.metric_name == "logit('\\x02') \u2212 logit('\\x03')" and r.metric_units == "logits"
    assert "metric logit('\\x02') \u2212 logit('\\x03') (logits), normalised: 0 = corrupted, " \
           "1 = clean" in r.describe()

    def anonymous(logits):
        return logits[:, -1, 0]
    r = patching_grid(model, "hello", "jello", anonymous, layers=[0], raw=True)
    assert r.metric_name is None and not r.normalised
    assert r.describe().endswith("metric (unnamed), raw values (not normalised)")
    torch.testing.assert_close(r.effect(), r.grid - r.corrupted_metric)


def test_a_knockout_that_empties_a_query_is_found_and_warned():
    assert emptied_queries(KnockoutSpec(from_positions=[-1], to_positions=[0]), 2, 1) == [0]
    assert emptied_queries(KnockoutSpec(from_positions=[-1], to_positions=[0]), 2, 3) == []
    assert emptied_queries(KnockoutSpec(heads=[1], from_positions=[1], to_positions=[0, 1]),
                           2, 3) == [1]


def test_knockout_hooks_warn_when_a_query_loses_every_key(model):
    with pytest.warns(UserWarning, match=r"removes every key of query position\(s\) \[0\]"):
        knockout_hooks(model, KnockoutSpec(from_positions=[0], to_positions=[0]), 4)


def test_visible_text_escapes_what_does_not_print():
    assert visible("a\u202eb\u200b\n\udc80 \xa0") == "a\\u202eb\\u200b\\n\\udc80 \\xa0"
