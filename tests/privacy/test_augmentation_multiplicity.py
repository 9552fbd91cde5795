"""Augmentation multiplicity (`--dp_augmentations=M`, De et al. 2022): a DP client's records are the
means over M view pairs of each of its images, clipped after the mean, so the clip still bounds each
client's release (DP-DCCO's statistics and update; DP-FedAvg's update).

  * The copies (`common.multiplied`): M copies of each image under ids of their own, so each gets
    views of its own; M = 1 is the data itself.
  * float64, the functions alone: a client's phase-2 record is the mean of the records it would
    release from each view pair alone, and the batched clipped sum is the sum of those means each
    clipped to C (some clients shortened, some not): no released record is longer than C.
  * A DP-DCCO round at M = 2 (noise 0, a clip that shortens some clients): the batched passes give
    the per-client loop's update and clip the same clients.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tests import spread
from tests.methods import test_dcco
from tests.privacy.test_per_client_clipping import (AUGMENT, ETA, HP, SEED, SHAPE, _clients,
                                                    _dp_round, float64)  # noqa: F401
from tests.methods.test_dcco_statistics import functional_model
from tff_ssl import experiment, losses
from tff_ssl.federated import common, grouping
from tff_ssl.methods import dcco, dcco_private, dcco_term, fedavg
from tff_ssl.methods.dcco import DCCOConfig

M = 2


def test_copies_have_ids_of_their_own_and_one_copy_is_the_data():
  data = {"images": np.arange(8, dtype=np.uint8).reshape(2, 2, 2, 1),
          "ids": np.array([7, 4], np.int64), "sizes": np.array([1, 1], np.int32)}
  out = common.multiplied(data, 3)
  assert out["ids"].numpy().tolist() == [21, 22, 23, 12, 13, 14]  # 7 * 3 + j, 4 * 3 + j.
  assert np.asarray(out["sizes"]).tolist() == [3, 3]
  assert np.array_equal(out["images"].numpy()[:3], np.repeat(data["images"][:1], 3, axis=0))
  assert common.multiplied(data, 1) is data


def test_a_clients_record_is_the_mean_over_its_view_pairs_then_clipped(float64):
  del float64
  model = functional_model(SHAPE)
  clients = _clients()[:5]  # Sizes 1, 2, 1, 4, 1.
  slot = grouping.pack(clients)[0]
  cfg = DCCOConfig(ssl="cco", hparams=HP, client_learning_rate=ETA, augment=AUGMENT, seed=SEED)
  client = dcco_term.client_config(cfg)
  weights = [tf.constant(w) for w in model.initial_weights]
  seed = common.round_seed(SEED, 0)
  entry = losses.get_statistics("cco")
  f, g = common.encode_views(model, weights, *common.views(common.multiplied(slot, M), seed,
                                                           AUGMENT))
  aggregate = {"statistics": entry.statistics(f, g),
               "count": tf.constant(float(len(slot["ids"])), tf.float64)}
  records = []
  for c in clients:  # Each view pair alone: copy j of image i is id i * M + j.
    n = len(c["ids"])
    pairs = [n * common.flatten(dcco_term.train_against(
        model, client, weights, seed, {"images": c["images"], "ids": c["ids"] * M + j},
        aggregate)[0]).numpy() for j in range(M)]
    assert not np.allclose(pairs[0], pairs[1])  # Each copy has views of its own.
    records.append(np.mean(pairs, axis=0))
    together = n * common.flatten(dcco_term.train_against(
        model, client, weights, seed, common.multiplied(c, M), aggregate)[0]).numpy()
    spread.within("a client's record from M copies vs the mean of its M pairs' records",
                  spread.relative_gap(together, records[-1]), 1e-10)
  # Phase 1 the same way: a client's statistics record is its per-image sum, the mean over the M
  # view pairs, clipped to C after the mean (`cfg.loss.clipped_sum`, as the process calls it).
  flat = lambda sums: np.concatenate([v.numpy().ravel() for v in sums.values()])  # noqa: E731
  bounds = np.cumsum([0] + [M * len(c["ids"]) for c in clients])  # Each client's rows, M-fold.
  means = np.array([flat(entry.clipped_sum(f[a:b], g[a:b], tf.zeros([b - a], tf.int32), 1,
                                           1e300)[0]) / M for a, b in zip(bounds[:-1], bounds[1:])])
  stats_clip = float(np.median(np.linalg.norm(means, axis=1)))
  segments, count = dcco_private.client_segments(common.multiplied(slot, M))
  sums, stats_norms = entry.clipped_sum(f, g, segments, count, M * stats_clip)
  np.testing.assert_allclose(stats_norms.numpy() / M, np.linalg.norm(means, axis=1), rtol=1e-12)
  factors = np.minimum(1.0, stats_clip / np.linalg.norm(means, axis=1))
  assert 0 < int(np.sum(factors < 1)) < len(clients)
  np.testing.assert_allclose(flat(sums) / M, np.sum(means * factors[:, None], axis=0), rtol=1e-10,
                             atol=1e-14)
  norms = np.array([np.linalg.norm(r) for r in records])
  clip = float(np.median(norms))
  released = [r * min(1.0, clip / n) for r, n in zip(records, norms)]
  assert 0 < int(np.sum(norms > clip)) < len(clients)
  assert max(np.linalg.norm(r) for r in released) <= clip * (1 + 1e-12)
  # What the process computes: the M-fold records clipped to M C, then / M.
  total, got_norms, _ = dcco_private.clipped_records(model, client.terms[0], AUGMENT, ETA, weights, seed,
                                             common.multiplied(slot, M), aggregate, M * clip,
                                             chunk=4 * M)
  spread.within("batched M-fold clipped sum / M vs the clipped means",
                spread.relative_gap(total.numpy() / M, sum(released)), 1e-10)
  spread.within("batched norms / M vs the means' norms",
                spread.relative_gap(got_norms.numpy() / M, norms), 1e-10)


def test_a_dp_dcco_round_with_two_view_pairs_clips_as_the_loop_does():
  _, clients = test_dcco.make_clients([1, 2, 1, 4, 1])
  loop_update, loop_metrics = _dp_round(True, clients, clip=40.0, augmentations=2)
  update, metrics = _dp_round(False, clients, clip=40.0, augmentations=2)
  fraction = metrics["aggregation"]["update_clipped_fraction"]
  assert 0 < fraction < 1 and fraction == loop_metrics["aggregation"]["update_clipped_fraction"]
  spread.within("DP-DCCO round at M = 2: batched clipping vs the per-client loop",
                spread.relative_gap(update, loop_update), 1e-3)


def test_view_pairs_without_dp_are_refused():
  with pytest.raises(ValueError, match="--dp_augmentations=2 averages each client's DP release"):
    experiment.ExperimentConfig(method="dcco", dp_augmentations=2)
  with pytest.raises(ValueError, match="dp_augmentations"):  # FedLAMA reads no DP flag.
    experiment.ExperimentConfig(method="fedlama", ssl="simclr").check_fields_for_method(
        {"dp_augmentations"})


@pytest.mark.parametrize("batch", [0, 4])
def test_a_dp_fedavg_clients_step_is_the_mean_of_its_view_pairs_steps(batch):
  """DP-FedAvg's clients (`ClientConfig.view_pairs`, from --dp_augmentations): one SGD step on the
  mean loss of M view pairs is the mean of the M steps each pair alone would take, full batch and in
  minibatches."""
  from tests.federated.test_round_anatomy import AUGMENT as AUG, clients_of, resnet  # pylint: disable=g-import-not-at-top
  from tff_ssl.federated.client_work import ClientConfig, local_training  # pylint: disable=g-import-not-at-top
  model = resnet()
  weights = [tf.constant(w) for w in model.initial_weights]
  data = clients_of([3], n=4)[0]
  seed = common.round_seed(5, 0)
  one = ClientConfig(ssl="simclr", client_learning_rate=0.05, augment=AUG, seed=5,
                     local_batch_size=batch)
  flat = lambda delta: np.concatenate([d.numpy().ravel() for d in delta])  # noqa: E731
  pairs = [flat(local_training(model, one, weights, seed, {"images": data["images"],
                                                           "ids": data["ids"] * M + j})[0])
           for j in range(M)]
  assert not np.allclose(pairs[0], pairs[1])
  both = flat(local_training(model, dataclasses.replace(one, view_pairs=M), weights, seed, data)[0])
  np.testing.assert_allclose(both, np.mean(pairs, axis=0), rtol=1e-4, atol=1e-7)


def test_dp_fedavg_reads_the_view_pairs_and_refuses_them_where_a_step_reports_one_pair():
  private = dict(dp="gaussian_fixed", dp_noise_multiplier=0.0, dp_augmentations=2)
  config = experiment.ExperimentConfig(method="fedavg", ssl="simclr", **private)
  assert fedavg.process_config(config)[0].view_pairs == 2
  with pytest.raises(ValueError, match=r"1 with a queue of keys or client terms \(\['fedx'\]\)"):
    experiment.ExperimentConfig(method="fedavg", ssl="simclr", fedx=True, **private)
  with pytest.raises(ValueError, match="--dp_augmentations=2 averages each client's DP release"):
    experiment.ExperimentConfig(method="fedavg", ssl="simclr", dp_augmentations=2)
