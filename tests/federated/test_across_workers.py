"""Every aggregation strategy, and DCCO's two phases, in both simulation modes: a round computed across
two TFF executor services (TFF's mergeable-computation context, as `bin/train --workers` runs it)
equals the same round on the local context, to float32 round-off.

The problem is test_grouping's well-conditioned one; each round starts from the local run's state, so
that a difference carried over from round 1 (the workers add their partial aggregates in another
order) does not compound into round 2."""

import contextlib

import pytest

from tff_ssl import aggregators, runtime
from tff_ssl.methods.dcco import DCCOConfig, DCCOProcess
from tff_ssl.federated.client_work import ClientConfig
from tff_ssl.federated.fedavg_process import FedAvgSSLProcess
from tff_ssl.federated.grouping import Simulation

from tests.federated.test_grouping import (AUGMENT, DCCO_ROUNDS, FEDAVG_ROUNDS, LR, REFERENCE,
                                           SEED, SGD, SHAPE, assert_same_rounds, plain_model,
                                           rounds_of_clients, run_two_rounds)


@pytest.fixture(scope="module")
def two_workers():
  with runtime.serve_local_workers(2) as targets:
    yield targets


@contextlib.contextmanager
def across(targets):
  runtime.configure_context(workers=targets)
  try:
    yield
  finally:
    runtime.configure_context(workers=[])


def compare(make_process, rounds, targets):
  """`make_process(mergeable)`'s rounds across `targets` against the local worker's."""
  states = []
  want = run_two_rounds(make_process(False), rounds, record=states)
  with across(targets):
    got = run_two_rounds(make_process(True), rounds, states=states)
  assert_same_rounds(got, want, "two workers vs the local worker")


@pytest.mark.parametrize("name", sorted(aggregators.AGGREGATORS))
def test_every_strategy_across_two_workers_equals_local(two_workers, name):
  model = plain_model()
  config = ClientConfig(ssl="simclr", client_learning_rate=LR["simclr"], augment=AUGMENT,
                           seed=SEED)
  factory = aggregators.AggregatorConfig(name=name).build(model)
  compare(lambda _: FedAvgSSLProcess(model, SHAPE, SGD, config, factory, REFERENCE),
          rounds_of_clients(FEDAVG_ROUNDS), two_workers)


@pytest.mark.parametrize("simulation", [REFERENCE, Simulation(group_size=2)], ids=["reference",
                                                                                    "grouped"])
def test_dcco_phases_across_two_workers_equal_local(two_workers, simulation):
  model = plain_model()
  config = DCCOConfig(client_learning_rate=LR["cco"], local_steps=1, augment=AUGMENT, seed=SEED)
  compare(lambda mergeable: DCCOProcess(model, SHAPE, SGD, config, simulation,
                                       split_phases=mergeable),
          rounds_of_clients(DCCO_ROUNDS), two_workers)


def test_a_grouped_strategy_across_two_workers_equals_local(two_workers):
  """A strategy whose per-client stage runs inside the slots (loss weights, L-DAWA angles)."""
  model = plain_model()
  config = ClientConfig(ssl="simclr", client_learning_rate=LR["simclr"], augment=AUGMENT,
                           seed=SEED)
  factory = aggregators.AggregatorConfig(name="ldawa_loss").build(model)
  compare(lambda _: FedAvgSSLProcess(model, SHAPE, SGD, config, factory, Simulation(group_size=2)),
          rounds_of_clients(FEDAVG_ROUNDS), two_workers)
