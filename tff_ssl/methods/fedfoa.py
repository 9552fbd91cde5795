"""FedFoA (Liu et al., "Feature Correlation-guided Knowledge Transfer for Federated Self-supervised
Learning"): clients exchange feature-correlation matrices R through a bank on the server and align
their features to each other's (the terms: `tff_ssl.losses.feature_correlation`).

    round t, client i (its id travels with it; FedFoA's part of a client's round)
      receives   the bank {(j, R_j)} (broadcast, `client_context`) and whether t > t_warm
      each local step b: features Z_{t,b} = the online projections of the batch (each view a batch)
                 R_{t,b} from Z_{t,b} = Q R (QR); after t_warm rounds the loss gains
                 lambda * sum_j ||Z - Q* R_j|| over the bank's entries j != i with
                 tr(R_j) > tr(R_{t,b})
      uploads    R_bar_t^i = the mean of its R_{t,b} over the round's steps (and views), beside its
                 update (`common.collect`: the type signature's `reports`)
    server     the bank keeps, per client, its newest R_bar (`update_bank`), in the method state:
               checkpointed with the rest, restored on resume

Homogeneous setting (`--fedfoa` with FedBYOL, FedU, FedEMA; `tff_ssl.methods.fedssl`): the term is
added to the base method's client loss; everything else (the global model, its aggregation, the
clients' own networks) is the base method's. `FedFoAStage` is FedFoA's server stage
(`federated.server_stage`): the bank in the method state, broadcast to the clients, refilled from their
reports; it wraps the base method's client state in a `FeatureCorrelationState` and adds the term. It
composes with other stages: FedLAMA's per-layer intervals (`--method=fedlama --fedfoa`).

The bank with many clients. The paper's setting is cross-silo (every client in every round), where the
bank holds R_bar_{t-1}^j of every client. Here it holds the `bank_size` clients that published most
recently (default: the clients per round, which is exactly that setting's bank): a returning client
replaces its own entry, a new one the oldest. So after 10,000 clients have taken part the server keeps
K n x n matrices and K ids (K = 10, n = 256: 2.6 MB), and a client keeps nothing for FedFoA between
rounds. Each local step computes an SVD per entry (`fedfoa_bank_size` bounds that cost).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf

from tff_ssl.config_fields import Field
from tff_ssl.federated import client_state as client_state_lib
from tff_ssl.federated.client_work import ClientTerm
from tff_ssl.federated.server_stage import ServerStage
from tff_ssl.losses import feature_correlation

BANKS = ("clients", "merged")

# FedFoA's settings as config fields (their one check).
LAMBDA = Field("fedfoa_lambda", 0.01, "FedFoA: the weight lambda of the alignment term.", lower=0,
               open_lower=True)
WARMUP = Field("fedfoa_warmup", 5, "FedFoA: rounds before the term starts.", lower=0)
NORM = Field("fedfoa_norm", "fro", "FedFoA: ||Z - Q* R_j|| as the Frobenius norm (fro) or its "
             "square.", choices=feature_correlation.NORMS)
SELECT = Field("fedfoa_select", "trace", "FedFoA: align to the bank's entries with a larger trace "
               "than the client's R (the paper's Algorithm 1) or to all.",
               choices=feature_correlation.SELECTIONS)
BANK = Field("fedfoa_bank", "clients", "FedFoA: the server's bank holds each client's newest R "
             "(clients) or one mean R (merged).", choices=BANKS)
BANK_SIZE = Field("fedfoa_bank_size", 0, "FedFoA: entries of the clients bank (0: the clients per "
                  "round).", lower=0)


@dataclasses.dataclass(frozen=True)
class FeatureCorrelationConfig:
  """FedFoA's settings (the paper's defaults).

  weight: lambda, the term's weight in the client's loss (0.01).
  warmup: t_warm, the rounds before the term starts (5; Algorithm 1: rounds t > t_warm, counted from
    1); the bank is filled from the first round on.
  norm, select: see the module docstring.
  bank: "clients" (default; Algorithm 1: the newest R of each of the other clients, client i leaving
    its own entry out) or "merged" (one entry, the mean of the last round's R's, own included).
  bank_size: the "clients" bank's capacity K: the K clients that published most recently (a
    returning client replaces its own entry). With every client in every round (the paper's
    cross-silo setting) and K = the clients per round, this is exactly R_{t-1}^j for every j.
  """

  weight: float = 0.01
  warmup: int = 5
  norm: str = "fro"
  select: str = "trace"
  bank: str = "clients"
  bank_size: int = 10

  def __post_init__(self):
    LAMBDA.check(self.weight)
    WARMUP.check(self.warmup)
    NORM.check(self.norm)
    SELECT.check(self.select)
    BANK.check(self.bank)
    if self.bank_size < 1:  # Resolved: the config's 0 is the clients per round.
      raise ValueError(f"fedfoa_bank_size must be >= 1; got {self.bank_size}")

  @property
  def capacity(self) -> int:
    """Entries the server's bank holds."""
    return 1 if self.bank == "merged" else self.bank_size


EMPTY = -1  # A bank slot no client has filled.
MERGED = -2  # The merged bank's one entry: nobody's own, so no client leaves it out.
KEY = "fedfoa"  # The term's entry in what local training carries.


@dataclasses.dataclass(frozen=True)
class FeatureCorrelationTerm(ClientTerm):
  """FedFoA's part of local training (a `ClientTerm`). It carries, from `FeatureCorrelationState.
  ssl_state`: `bank` [K, n, n] and `valid` [K] (the entries this client aligns to), and the running
  sums of its R (`r_sum`), steps, term and partner count. Each step adds lambda * the alignment term
  (averaged over the two views' projections, `feature_correlation_term`) and accumulates R of the
  step's batch (both views)."""

  config: FeatureCorrelationConfig
  dim: int  # n: the projection's dimension.
  key = KEY

  @property
  def stateful(self) -> bool:
    return True

  def loss(self, step, carried):
    term, partners = feature_correlation_term(self.config, step.outputs, carried)
    return self.config.weight * term, (tf.stop_gradient(term), partners)

  def after_step(self, carried, step, record):
    r = [feature_correlation.correlation_r(tf.stop_gradient(z))
         for z in (step.outputs.z1, step.outputs.z2)]
    term, partners = record
    return dict(carried, r_sum=carried["r_sum"] + (r[0] + r[1]) / 2.0,
                steps=carried["steps"] + 1.0, term_sum=carried["term_sum"] + term,
                partner_sum=carried["partner_sum"] + partners)

  def report_spec(self, model):
    """`r` (R_bar, n x n), `term` and `partners` (the mean over the client's steps of the summed
    alignment term and of the number of entries it aligned to: measurements)."""
    del model
    scalar = tf.TensorSpec([], tf.float32)
    return collections.OrderedDict(r=tf.TensorSpec([self.dim, self.dim], tf.float32),
                                   term=scalar, partners=scalar)

  def report(self, carried, upload):
    del upload
    steps = tf.maximum(carried["steps"], 1.0)
    return collections.OrderedDict(r=carried["r_sum"] / steps, term=carried["term_sum"] / steps,
                                   partners=carried["partner_sum"] / steps)


def feature_correlation_term(fc: FeatureCorrelationConfig, outputs, carried: dict):
  """FedFoA's alignment term of one step (`losses.feature_correlation`), averaged over the two views'
  projections (each view is a batch of features Z, as the SSL loss is symmetrized), and the mean
  number of bank entries it aligned to. Zero, with no SVD computed, when no entry is valid (the
  warm-up rounds, an empty bank)."""
  bank, valid = carried["bank"], carried["valid"]

  def term():
    parts = [feature_correlation.alignment_loss(z, bank, valid, fc.norm, fc.select)
             for z in (outputs.z1, outputs.z2)]
    return (parts[0][0] + parts[1][0]) / 2.0, (parts[0][1] + parts[1][1]) / 2.0

  zero = tf.constant(0.0)
  return tf.cond(tf.reduce_any(valid), term, lambda: (zero, zero))


class FeatureCorrelationState(client_state_lib.ClientState):
  """The base method's client state (`inner`), plus FedFoA's part of the round: the bank in the
  broadcast context, the running sums of the client's local training, and its report.

  Context (under KEY, beside the base state's entries if it has any): `bank` [K, n, n], `bank_ids` [K]
  (int64; EMPTY, MERGED or a client id), `active` (1.0 after the warm-up rounds).
  Report: `r` (R_bar, n x n), `term` and `partners` (the mean over the client's steps of the summed
  alignment term and of the number of entries it aligned to: measurements).
  """

  def __init__(self, inner: client_state_lib.ClientState, config: FeatureCorrelationConfig,
               dim: int):
    self.inner = inner
    self.config = config
    self.dim = dim

  def spec(self, model):
    return self.inner.spec(model)

  def initial(self, model):
    return self.inner.initial(model)

  def context_spec(self, model):
    k, n = self.config.capacity, self.dim
    out = collections.OrderedDict(self.inner.context_spec(model) or {})
    out[KEY] = collections.OrderedDict(bank=tf.TensorSpec([k, n, n], tf.float32),
                                       bank_ids=tf.TensorSpec([k], tf.int64),
                                       active=tf.TensorSpec([], tf.float32))
    return out

  def _inner(self, context):
    """The base state's part of the context (None where it reads none)."""
    inner = collections.OrderedDict((k, v) for k, v in context.items() if k != KEY)
    return inner or None

  def begin(self, state, weights, context=None):
    return self.inner.begin(state, weights, self._inner(context))

  def ssl_state(self, state, start, context=None, client_id=None):
    out = dict(self.inner.ssl_state(state, start, self._inner(context), None) or {})
    mine = context[KEY]
    ids = mine["bank_ids"]
    valid = tf.logical_and(tf.not_equal(ids, EMPTY), tf.not_equal(ids, client_id))
    zero = tf.constant(0.0)
    out[KEY] = dict(bank=mine["bank"], valid=tf.logical_and(valid, mine["active"] > 0),
                    r_sum=tf.zeros([self.dim, self.dim]), steps=zero, term_sum=zero,
                    partner_sum=zero)
    return out

  def measurements(self, states):
    return self.inner.measurements(states)

  def end(self, state, weights, delta, num_examples, loss, ssl_state=None, context=None):
    return self.inner.end(state, weights, delta, num_examples, loss, ssl_state,
                          self._inner(context))


def empty_bank(config: FeatureCorrelationConfig, dim: int) -> collections.OrderedDict:
  """The server's bank before any report: `r` [K, n, n], `ids` [K] (EMPTY), `stamp` [K] (the order
  in which the entries were written; -1: never)."""
  k = config.capacity
  return collections.OrderedDict(r=np.zeros([k, dim, dim], np.float32),
                                 ids=np.full([k], EMPTY, np.int64),
                                 stamp=np.full([k], -1, np.int64))


def update_bank(bank, client_ids: Sequence[int], rs: np.ndarray,
                config: FeatureCorrelationConfig) -> collections.OrderedDict:
  """The bank after a round's reports (client ids and their R_bar, in the round's order).

  "clients": a reporting client's entry is replaced in place; a client without one takes an empty
  slot, else the entry written longest ago (first in, first out). With more new clients than slots,
  the ones reported last (in the round's sampling order) stay.
  "merged": the one entry is the mean of the round's R_bar's.
  """
  r = np.array(bank["r"], np.float32)
  ids = np.array(bank["ids"], np.int64)
  stamp = np.array(bank["stamp"], np.int64)
  rs = np.asarray(rs, np.float32)
  if config.bank == "merged":
    if len(rs):
      r[0], ids[0], stamp[0] = rs.mean(axis=0), MERGED, stamp[0] + 1
    return collections.OrderedDict(r=r, ids=ids, stamp=stamp)
  for cid, value in zip(client_ids, rs):
    slots = np.flatnonzero(ids == int(cid))
    slot = int(slots[0]) if slots.size else int(np.argmin(stamp))  # Empty slots have stamp -1.
    r[slot], ids[slot], stamp[slot] = value, int(cid), stamp.max() + 1
  return collections.OrderedDict(r=r, ids=ids, stamp=stamp)


def measurements(reports: dict, bank) -> collections.OrderedDict:
  """A round's FedFoA measurements (aggregation.csv): the clients' mean alignment term per step
  (`fedfoa_term`), mean number of entries aligned to (`fedfoa_partners`), mean tr(R_bar)
  (`fedfoa_trace`), and the bank's filled entries."""
  return collections.OrderedDict(
      fedfoa_term=np.float32(np.mean(reports["term"])),
      fedfoa_partners=np.float32(np.mean(reports["partners"])),
      fedfoa_trace=np.float32(np.mean(np.trace(reports["r"], axis1=1, axis2=2))),
      fedfoa_bank_entries=np.float32(np.sum(np.asarray(bank["ids"]) != EMPTY)))


def client_context(config: FeatureCorrelationConfig, bank, round_num: int) -> collections.OrderedDict:
  """What the server broadcasts to a round's clients (`FeatureCorrelationState.context_spec()[KEY]`):
  the bank, and whether the warm-up rounds are over."""
  return collections.OrderedDict(
      bank=np.asarray(bank["r"], np.float32), bank_ids=np.asarray(bank["ids"], np.int64),
      active=np.float32(round_num >= config.warmup))


@dataclasses.dataclass(frozen=True)
class FedFoAStage(ServerStage):
  """FedFoA's server stage (`federated.server_stage`): the bank as its part of the method state,
  broadcast each round (`client_context`), refilled from the clients' reports (`update_bank`); its
  clients keep the base method's state wrapped in a `FeatureCorrelationState` and train with the
  `FeatureCorrelationTerm`."""

  config: FeatureCorrelationConfig
  dim: int  # n: the projection's dimension.
  key = KEY
  client_state_role = "wraps"  # The base method's state, in a FeatureCorrelationState.

  def check(self, model):
    if model.output_dims[0] != self.dim:
      raise ValueError(f"FedFoA's bank holds {self.dim} x {self.dim} matrices; the model's "
                       f"projection has {model.output_dims[0]} dimensions")

  def initial_state(self):
    return empty_bank(self.config, self.dim)

  def context(self, part, round_num):
    return client_context(self.config, part, round_num)

  def client_state(self, inner, model):
    del model
    if inner is None:
      raise ValueError("FedFoA reaches the clients' local training through their state: it goes "
                       "with a method whose clients keep one (FedBYOL, FedU, FedEMA, FedLAMA)")
    return FeatureCorrelationState(inner, self.config, self.dim)

  def terms(self):
    return (FeatureCorrelationTerm(self.config, self.dim),)

  def before_optimizer(self, part, round_num, update, out):
    del round_num
    reports = out["reports"]
    bank = update_bank(part, reports["client"], reports[KEY]["r"], self.config)
    return update, bank, measurements(reports[KEY], bank)


def check_batch(config, dim: int) -> None:
  """FedFoA factorizes each local batch's m x n projections with m >= n: a batch must hold at least
  n images (ValueError naming the values otherwise)."""
  if 0 < config.local_batch_size < dim:
    raise ValueError(f"FedFoA factorizes each local batch's projections (m x n) with m >= n: "
                     f"--local_batch_size={config.local_batch_size} is below the projection's "
                     f"n = {dim}; raise it or lower --projector's last size")


def feature_correlation_config(config) -> FeatureCorrelationConfig:
  """FedFoA's settings from an `ExperimentConfig` (bank size 0: the clients per round)."""
  return FeatureCorrelationConfig(
      weight=config.fedfoa_lambda, warmup=config.fedfoa_warmup, norm=config.fedfoa_norm,
      select=config.fedfoa_select, bank=config.fedfoa_bank,
      bank_size=config.fedfoa_bank_size or config.clients_per_round)


# The fields of FedFoA's term, read by the methods it goes with.
FEDFOA = Field("fedfoa", False, "FedBYOL/FedU/FedEMA, FedLAMA and heterogeneous clients: add FedFoA's "
               "feature-correlation alignment to the clients' loss (tff_ssl/methods/fedfoa.py).")
FIELDS = (FEDFOA, LAMBDA, WARMUP, NORM, SELECT, BANK, BANK_SIZE)
CLIENT_STATE_FIELDS = FIELDS  # Its stage wraps the clients' state (`addons`): stateful hosts only.


def stages(config):
  """A maker of FedFoA's server stage where `config.fedfoa`, else of none (an add-on's stages,
  `addons`); the settings are parsed here, once. The stage checks the model's projection when the
  process is built."""
  if not config.fedfoa:
    return lambda model, mask: ()
  stage = FedFoAStage(feature_correlation_config(config), config.projector[-1])
  return lambda model, mask: (stage,)


def min_samples(config, base: int) -> int:
  """The fewest images a client needs: with FedFoA, a full batch of at least n (the projection's
  dimension) images."""
  return max(base, config.projector[-1]) if config.fedfoa else base


def validate(config) -> None:
  """FedFoA's settings of `config` (nothing without `--fedfoa`)."""
  if config.fedfoa:
    feature_correlation_config(config)
    check_batch(config, config.projector[-1])
