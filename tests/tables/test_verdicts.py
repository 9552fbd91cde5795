"""The verdict rule (tff_ssl/verdicts.py) on hand-made numbers: paired differences, the t interval
against a printed t table, and the five verdicts at and around the tie margin."""

import math

import pytest

from tff_ssl import verdicts


def rows(per_seed_points, base=0.70, labels=(0, 1)):
  """Two rows' accuracies keyed by (training seed, label seed) whose paired difference at seed s is
  per_seed_points[s] points at every label seed."""
  better, worse = {}, {}
  for seed, d in enumerate(per_seed_points):
    for label in labels:
      worse[(seed, label)] = base + 0.01 * label
      better[(seed, label)] = base + 0.01 * label + d / 100
  return better, worse


def test_paired_differences_average_label_seeds_within_a_training_seed():
  better = {(0, 0): 0.75, (0, 1): 0.73, (1, 0): 0.70, (1, 1): 0.74, (2, 0): 0.9}
  base = {(0, 0): 0.70, (0, 1): 0.72, (1, 0): 0.71, (1, 1): 0.71, (2, 0): 0.8, (2, 1): 0.8}
  # Seed 0: (5 + 1) / 2; seed 1: (-1 + 3) / 2; seed 2 has label seed 1 in one row only: not paired.
  assert verdicts.paired_differences(better, base) == pytest.approx({0: 3.0, 1: 1.0})


def test_interval_is_students_t_at_90_percent():
  # Differences 1, 2, 3: mean 2, s = 1; t(0.95, 2 df) = 2.920 (any printed t table).
  iv = verdicts.interval({0: 1.0, 1: 2.0, 2: 3.0})
  half = 2.920 / math.sqrt(3)
  assert (iv.mean, iv.seeds) == (2.0, 3)
  assert iv.low == pytest.approx(2 - half, abs=1e-3) and iv.high == pytest.approx(2 + half, abs=1e-3)
  # Two seeds: t(0.95, 1 df) = 6.314.
  iv = verdicts.interval({0: 1.0, 1: 3.0})
  assert iv.high - iv.mean == pytest.approx(6.314 * math.sqrt(2) / math.sqrt(2), abs=1e-3)
  assert verdicts.interval({0: 1.0}) is None


@pytest.mark.parametrize("diffs,want", [
    ([3.0, 4.0, 5.0], "holds"),           # [2.3, 5.7], above +1.
    ([-3.0, -4.0, -5.0], "fails"),        # Below -1.
    ([0.2, 0.4, 0.3], "tie"),             # [0.13, 0.47]: every seed "above", inside +-1.
    ([0.5, 1.5, 2.5], "inconclusive"),    # [-0.19, 3.19]: straddles +1.
    ([-0.5, -1.5, -2.5], "inconclusive"),  # Straddles -1.
    ([-2.0, 0.0, 2.0], "inconclusive"),   # Straddles both.
])
def test_above_with_a_tie_margin_of_one_point(diffs, want):
  got, iv, why = verdicts.check(*rows(diffs), "above", tie=1.0)
  assert (got, why) == (want, "") and iv.seeds == 3


def test_a_sign_test_would_call_holds_where_the_rule_calls_tie_or_inconclusive():
  """The old reading (every seed's difference > 0) against the declared rule, on differences that
  straddle or sit inside the tie margin."""
  for diffs in ([0.2, 0.4, 0.3], [0.5, 1.5, 2.5], [0.1, 0.9, 1.6]):
    assert all(d > 0 for d in diffs)
    assert verdicts.check(*rows(diffs), "above", tie=1.0)[0] in ("tie", "inconclusive")


def test_at_least_within_and_by():
  assert verdicts.check(*rows([0.2, -0.4, 0.3]), "at_least", tie=1.0)[0] == "holds"  # A tie.
  assert verdicts.check(*rows([-3.0, -4.0, -5.0]), "at_least", tie=1.0)[0] == "fails"
  assert verdicts.check(*rows([-0.5, -1.5, -2.5]), "at_least", tie=1.0)[0] == "inconclusive"
  # Within 3 points: [-1.8, -0.2] inside; [3.3, 6.7] outside; [0.8, 4.2] straddles +3.
  assert verdicts.check(*rows([-1.0, -1.5, -0.5]), "within", tie=1.0, amount=3.0)[0] == "holds"
  assert verdicts.check(*rows([4.0, 5.0, 6.0]), "within", tie=1.0, amount=3.0)[0] == "fails"
  assert verdicts.check(*rows([1.5, 2.5, 3.5]), "within", tie=1.0, amount=3.0)[0] == "inconclusive"
  # By at least 4 points ("a significant margin"): [10.3, 13.7] holds; [2.3, 5.7] straddles 4.
  assert verdicts.check(*rows([11.0, 12.0, 13.0]), "by", tie=1.0, amount=4.0)[0] == "holds"
  assert verdicts.check(*rows([3.0, 4.0, 5.0]), "by", tie=1.0, amount=4.0)[0] == "inconclusive"
  assert verdicts.check(*rows([1.0, 1.5, 2.0]), "by", tie=1.0, amount=4.0)[0] == "fails"


def test_one_seed_is_untested_with_its_reason_and_bad_rules_are_refused():
  got, iv, why = verdicts.check(*rows([5.0]), "above", tie=1.0)
  assert (got, iv, why) == ("untested", None, "1 paired training seed; the rule needs 2")
  with pytest.raises(ValueError, match="tie margin must be >= 0 points; got -1"):
    verdicts.verdict(verdicts.Interval(0, -1, 1, 3), "above", tie=-1)
  with pytest.raises(ValueError, match="'within' needs a positive number of points"):
    verdicts.verdict(verdicts.Interval(0, -1, 1, 3), "within", tie=1)
  with pytest.raises(ValueError, match="relation 'below' is not one of"):
    verdicts.verdict(verdicts.Interval(0, -1, 1, 3), "below", tie=1)
