"""Which clients take part in a round (`--client_sampling`), drawn from the run's seed and the round.

    fixed    `clients_per_round` clients, uniformly without replacement
             (`tff.simulation.build_uniform_sampling_fn`): every round has exactly K clients.
    poisson  each of the `num_clients` clients independently with probability q = K / num_clients
             (`np.random.default_rng([seed, round, POISSON_STREAM])`): a round's size is Binomial(N, q),
             K on average. The sampling DP-SGD's and DP-FedAvg's analyses assume for "add or remove
             one client" neighbours (`privacy.accounting`: `PoissonSampledDpEvent`).

Either is a pure function of (seed, round), so a resumed run samples the rounds the uninterrupted run
would. The public count a DP release divides by stays K (the expected size), as DP-FedAvg's does
under Poisson sampling (McMahan et al., 2018): dividing by the realized size would leak it.

A Poisson round may sample nobody. A run is refused (`check`) where that has probability above
`EMPTY_RUN_BOUND` over its planned rounds, and a round that still draws nobody raises (it cannot
happen at the bound but by a one-in-a-million draw).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import tensorflow_federated as tff

from tff_ssl.config_fields import Field

# Config fields (`ExperimentConfig`), declared by their owner.
CLIENTS_PER_ROUND = Field("clients_per_round", 64, "Clients sampled per round "
                          "(--client_sampling=poisson: on average).", lower=1)


SAMPLINGS = ("fixed", "poisson")
CLIENT_SAMPLING = Field(
    "client_sampling", "fixed", "How a round's clients are drawn: fixed (clients_per_round clients, "
    "uniformly without replacement) or poisson (each client independently with probability "
    "clients_per_round / num_clients: rounds of varying size, clients_per_round on average; DP "
    "accounts with the Poisson-subsampled Gaussian).", choices=SAMPLINGS)

POISSON_STREAM = 0x9015  # Keeps the Poisson draws apart from the seed's other streams.
# The largest probability, over a run's planned rounds, that some Poisson round samples nobody.
EMPTY_RUN_BOUND = 1e-6


def empty_round_probability(num_clients: int, clients_per_round: int, rounds: int) -> float:
  """P(at least one of `rounds` Poisson rounds samples no client), q = clients_per_round / N."""
  q = clients_per_round / num_clients
  if q >= 1.0:
    return 0.0
  empty = math.exp(num_clients * math.log1p(-q))  # (1 - q)^N for one round.
  return -math.expm1(rounds * math.log1p(-empty)) if empty < 1.0 else 1.0


def check(sampling: str, num_clients: int, clients_per_round: int, rounds: int) -> None:
  """ValueError (one line) where `sampling` cannot run these rounds."""
  CLIENT_SAMPLING.check(sampling)
  if sampling != "poisson":
    return
  p = empty_round_probability(num_clients, clients_per_round, rounds)
  if p > EMPTY_RUN_BOUND:
    need = clients_per_round
    while empty_round_probability(num_clients, need, rounds) > EMPTY_RUN_BOUND and \
        need < num_clients:
      need += 1
    raise ValueError(f"--client_sampling=poisson at clients_per_round={clients_per_round} of "
                     f"{num_clients} samples no client in some round of {rounds} with probability "
                     f"{p:.2g}; raise clients_per_round to >= {need} or use --client_sampling=fixed")


def round_sampler(sampling: str, num_clients: int, clients_per_round: int,
                  seed: int) -> Callable[[int], list[int]]:
  """round -> the ids (0 .. num_clients - 1) of that round's clients (fixed: in the sampler's order;
  poisson: ascending)."""
  CLIENT_SAMPLING.check(sampling)
  if sampling == "fixed":
    sample = tff.simulation.build_uniform_sampling_fn(list(range(num_clients)), replace=False,
                                                      random_seed=seed)
    return lambda r: [int(c) for c in sample(r, clients_per_round)]
  q = clients_per_round / num_clients

  def poisson(r: int) -> list[int]:
    draw = np.random.default_rng([seed, r, POISSON_STREAM]).random(num_clients)
    ids = [int(c) for c in np.flatnonzero(draw < q)]
    if not ids:
      raise ValueError(f"round {r}: Poisson sampling at q = {q:.3g} drew no client (probability "
                       f"(1 - q)^{num_clients}); raise clients_per_round")
    return ids

  return poisson
