"""The round composer (`tff_ssl.federated.composer`): a two-phase round of hand-computable numbers,
its phases alone, a stateful phase's slot, and the composition checks."""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_ssl.federated import composer

F32 = tff.TensorType(np.float32)
ARGS = [("scale", tff.FederatedType(F32, tff.SERVER)),
        ("x", tff.FederatedType(F32, tff.CLIENTS)),
        ("n", tff.FederatedType(F32, tff.CLIENTS))]


@tff.tensorflow.computation(F32, F32, F32)
def scaled(scale, x, n):
  return scale * x, n


@tff.tensorflow.computation(F32, F32, F32)
def centred(mean, x, n):
  return (x - mean) ** 2, n


def _mean_of(agg, out, names):
  del out, names
  return collections.OrderedDict(mean=agg.result)


def _spread_of(agg, out, names):
  del names
  return collections.OrderedDict(spread=agg.result, total=tff.federated_sum(out[1]))


def two_phase(second=composer.Mean()):
  return composer.Round(ARGS, [
      composer.Phase("first", scaled, ("scale", "x", "n"), composer.Mean(), ("mean",), _mean_of),
      composer.Phase("second", centred, ("mean", "x", "n"), second, ("spread", "total"),
                     _spread_of)], ("mean", "spread", "total"))


def test_two_phases_pass_their_results_by_name():
  # Clients x = 1, 2, 4 with weights 1, 1, 2 at scale 2: the weighted mean of 2x is
  # (2 + 4 + 16) / 4 = 5.5; the second phase centres x on it:
  # ((1-5.5)^2 + (2-5.5)^2 + 2 (4-5.5)^2) / 4 = (20.25 + 12.25 + 4.5) / 4 = 9.25.
  out = two_phase().computation()(scale=2.0, x=[1.0, 2.0, 4.0], n=[1.0, 1.0, 2.0])
  assert (out["mean"], out["spread"], out["total"]) == (5.5, 9.25, 4.0)


def test_a_phase_alone_takes_an_earlier_result_as_an_argument():
  first = two_phase().computation(["first"], outputs=["mean"], single=True)
  assert first(scale=1.0, x=[1.0, 3.0], n=[1.0, 3.0]) == 2.5
  second = two_phase().computation(
      ["second"], given=[("mean", tff.FederatedType(F32, tff.SERVER))],
      outputs=["spread", "total"], order=["mean", "scale", "x", "n"])
  assert [str(t) for t in second.type_signature.parameter] == [
      "float32@SERVER", "float32@SERVER", "{float32}@CLIENTS", "{float32}@CLIENTS"]
  out = second(2.5, 1.0, [1.0, 3.0], [1.0, 3.0])  # (2.25 + 3 x 0.25) / 4 = 0.75
  assert (out["spread"], out["total"]) == (0.75, 4.0)


def test_a_stateful_phase_has_its_slot_in_states():
  # TFF's weighted sum (a stateful process: SumFactory's state is ()), under the phase's name.
  factory = tff.aggregators.SumFactory().create(F32)

  class Sum(composer.Factory):
    def __call__(self, state, value, weight):
      return super().__call__(state, value, None)

  round_ = two_phase(Sum(factory))
  assert list(round_.initialize()) == ["second"]
  out = round_.computation()(scale=2.0, x=[1.0, 2.0, 4.0], n=[1.0, 1.0, 2.0],
                             aggregator_states=round_.initialize())
  assert out["spread"] == pytest.approx(20.25 + 12.25 + 2.25)  # Summed, unweighted.
  assert list(out["aggregator_states"]) == ["second"]


@pytest.mark.parametrize("phases, outputs, error", [
    ([("a", ("scale", "y"), ("mean",))], ("mean",), r"phase 'a' reads \['y'\]"),
    ([("a", ("scale", "x", "n"), ("mean",)), ("b", ("mean", "x", "n"), ("mean",))], ("mean",),
     r"phase 'b' gives \['mean'\], which the round already has"),
    ([("a", ("scale", "x", "n"), ("mean",))], ("spread",), r"outputs \['spread'\]"),
    ([("a", ("scale", "x", "n"), ("mean",)), ("a", ("mean", "x", "n"), ("z",))], ("z",),
     "distinct names"),
])
def test_composition_is_checked(phases, outputs, error):
  with pytest.raises(ValueError, match=error):
    composer.Round(ARGS, [composer.Phase(name, scaled, reads, composer.Mean(), gives, _mean_of)
                          for name, reads, gives in phases], outputs).computation()


def test_a_phase_gives_what_it_declares():
  round_ = composer.Round(ARGS, [composer.Phase(
      "a", scaled, ("scale", "x", "n"), composer.Mean(), ("average",), _mean_of)], ("average",))
  with pytest.raises(ValueError, match=r"declares \('average',\) and gave \('mean',\)"):
    round_.computation()


def test_weights_are_broadcast_once_a_round():
  text = str(two_phase().computation().to_building_block())
  assert text.count("federated_broadcast") == 2  # scale, then the first phase's mean.
