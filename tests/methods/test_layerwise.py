"""Layer-wise and progressive stages over a ViT's blocks: the schedule by hand; through whole rounds,
frozen blocks bit-identical across a stage, later blocks untouched, block s starting from block s - 1,
the upload holding only the stage's trained tensors (its bytes from the TFF type). LW-FedSSL: the
auxiliary split out of the clients' data, calibration changing only the server's copy, the
alignment term against NumPy. FLL + DD: a skipped block is the identity; stage 1 (nothing frozen)
is FedMoCo-LW's, later stages are not."""

import dataclasses

import numpy as np
import pytest

from tff_ssl import cost
from tff_ssl.ssl import mocov3
from tff_ssl.data import synthetic
from tff_ssl.experiment import ExperimentConfig
from tff_ssl import runner
from tff_ssl.federated import client_work, common
from tff_ssl.methods import alignment, layerwise
from tff_ssl.federated.client_work import ClientConfig
from tff_ssl.ssl import Hparams
from tff_ssl.models import vit
from tff_ssl.federated.functional import FunctionalModel

import tensorflow as tf


def test_schedule_by_hand():
  # 7 rounds over 3 blocks: 2 rounds a stage, the last stage takes the round left over.
  assert [layerwise.stage_of(r, 7, 3) for r in range(7)] == [1, 1, 2, 2, 3, 3, 3]
  assert layerwise.block_of("encoder/block12_attn/query/kernel") == 12
  assert layerwise.block_of("encoder/patch_embed/kernel") == 1
  assert layerwise.block_of("encoder/tokens/cls") == 1
  assert layerwise.block_of("encoder/norm/gamma") == 0 and layerwise.block_of("predictor/x") == 0
  names = ["encoder/patch_embed/kernel", "encoder/block1_ln1/gamma", "encoder/block2_mlp1/kernel",
           "encoder/norm/beta", "projector/projector_dense1/kernel"]
  assert [layerwise.trained(n, 2, "layerwise") for n in names] == [False, False, True, True, True]
  assert [layerwise.trained(n, 2, "progressive") for n in names] == [True] * 5
  with pytest.raises(ValueError, match=r"rounds \(2\) must be >= the encoder's blocks \(3\)"):
    layerwise.stage_of(0, 2, 3)


def config(method, **fields):
  return ExperimentConfig(**{
      "method": method, "ssl": "mocov3", "encoder": "vit_mini", "patch_size": 7, "depth": 2,
      "width": 0.5, "projector": (32, 16), "predictor": (32, 16), "temperature": 0.2,
      "dataset": "synthetic", "rounds": 4, "client_learning_rate": 0.05, "server_optimizer": "sgd",
      "server_learning_rate": 1.0, "server_lr_schedule": "constant", "seed": 0, **fields})


def run(method, **fields):
  cfg = config(method, **fields)
  train = synthetic("train", num_examples=24, seed=0)
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(runner.ssl_model_builder(cfg, train.image_shape))
  aux = common.client_inputs(train.images[12:18], np.arange(12, 18))  # No client's.
  process = runner.build_process(cfg, model, train.image_shape, aux)
  clients = [common.client_inputs(train.images[i:i + 4], np.arange(i, i + 4)) for i in (0, 4, 8)]
  states = [process.initialize()]
  for _ in range(4):
    states.append(process.next(states[-1], clients)[0])
  return process, model, states


@pytest.fixture(scope="module")
def layerwise_run():
  return run("fedmoco_lw")


def tensors(model, states, r, block):
  return [np.asarray(states[r].weights[i]) for i, n in enumerate(model.names)
          if layerwise.block_of(n) == block and n.startswith("encoder/")]


def test_frozen_blocks_are_bit_identical_across_a_stage_and_later_blocks_wait(layerwise_run):
  process, model, states = layerwise_run
  assert [process.stage(r) for r in range(4)] == [1, 1, 2, 2]
  for r in (3, 4):  # Stage 2 (rounds 2, 3): block 1 as stage 1 left it, bit for bit.
    for a, b in zip(tensors(model, states, r, 1), tensors(model, states, 2, 1)):
      np.testing.assert_array_equal(a, b)
  for r in (1, 2):  # Stage 1 leaves block 2 at its initialization.
    for a, b in zip(tensors(model, states, r, 2), tensors(model, states, 0, 2)):
      np.testing.assert_array_equal(a, b)
  # ...and trains block 1, then block 2.
  assert any(not np.array_equal(a, b) for a, b in zip(tensors(model, states, 2, 1),
                                                      tensors(model, states, 0, 1)))
  assert any(not np.array_equal(a, b) for a, b in zip(tensors(model, states, 4, 2),
                                                      tensors(model, states, 2, 2)))


def test_block_s_starts_from_block_s_minus_1(layerwise_run):
  process, model, states = layerwise_run
  start = process.start_weights(states[2])  # The first round of stage 2.
  index = {n: i for i, n in enumerate(model.names)}
  copied = [n for n in model.names if n.startswith("encoder/block2_")]
  assert copied
  for n in copied:
    np.testing.assert_array_equal(start[index[n]], states[2].weights[index[n.replace("block2_",
                                                                                       "block1_")]])
  # Not at the second round of the stage.
  again = process.start_weights(states[3])
  for n in copied:
    np.testing.assert_array_equal(again[index[n]], states[3].weights[index[n]])


def test_the_upload_holds_only_the_stages_trained_tensors(layerwise_run):
  process, model, _ = layerwise_run
  for s in (1, 2):
    stage = process.process(s)
    names = process.stage_models[s - 1].names
    trained = [n for n in names if layerwise.trained(n, s, "layerwise")]
    assert stage.mask.select(names) == trained
    upload = stage.client_update.type_signature.result[0]["value"]  # A slot's aggregated Delta.
    sizes = {n: int(np.prod(spec.shape)) * 4 for n, spec in zip(model.names, model.weight_specs)}
    assert cost.message_bytes(upload) == sum(sizes[n] for n in trained)
  assert not any(n.startswith("encoder/block1_") for n in process.stage_mask(2).select(
      process.stage_models[1].names))


def test_progressive_stage_trains_every_block_so_far():
  process, model, states = run("prog_fedssl")
  assert any(not np.array_equal(a, b) for a, b in zip(tensors(model, states, 4, 1),
                                                      tensors(model, states, 2, 1)))


def test_bad_settings_name_the_value():
  with pytest.raises(ValueError, match="--server_optimizer=sgd --server_lr_schedule=constant"):
    config("fedmoco_lw", server_optimizer="adam")
  cfg = config("fedmoco_lw", encoder="resnet14", patch_size=0, depth=0)
  train = synthetic("train", num_examples=8, seed=0)
  model = FunctionalModel(runner.ssl_model_builder(cfg, train.image_shape))
  with pytest.raises(ValueError, match="encoder of numbered blocks"):
    runner.build_process(cfg, model, train.image_shape)


def test_the_auxiliary_split_is_seeded_and_no_clients():
  cfg = config("lw_fedssl", num_clients=10, samples_per_client=8, alpha=1000.0, clients_per_round=2)
  train = synthetic("train", num_examples=200, seed=0)
  pool, held = runner.auxiliary_split(cfg, len(train))
  assert len(held) == 20 and len(pool) == 180 and not set(pool) & set(held)
  rows = runner.partition(cfg, train)
  assert not set(np.concatenate([np.asarray(r) for r in rows])) & set(held)
  np.testing.assert_array_equal(runner.auxiliary_split(cfg, len(train))[1], held)
  assert not np.array_equal(runner.auxiliary_split(config("lw_fedssl", seed=1), 200)[1], held)
  # Methods without calibration keep every image for the clients.
  assert len(runner.auxiliary_split(config("fedmoco_lw"), 200)[1]) == 0
  with pytest.raises(ValueError, match="auxiliary_fraction must be in"):
    config("lw_fedssl", auxiliary_fraction=1.0)
  with pytest.raises(ValueError, match="auxiliary_fraction 0.001 of 200 images gives the server 0"):
    runner.auxiliary_split(config("lw_fedssl", auxiliary_fraction=0.001), 200)
  with pytest.raises(ValueError, match="--auxiliary_fraction is not used by method 'fedmoco_lw'"):
    config("fedmoco_lw").check_fields_for_method({"auxiliary_fraction"})


def test_alignment_term_against_numpy():
  rng = np.random.default_rng(0)
  local, glob = rng.normal(size=(5, 7)), rng.normal(size=(5, 7))
  l = local / np.linalg.norm(local, axis=1, keepdims=True)
  g = glob / np.linalg.norm(glob, axis=1, keepdims=True)
  logits = l @ g.T / 0.2
  top = logits.max(1, keepdims=True)
  want = np.mean(np.log(np.exp(logits - top).sum(1)) + top[:, 0] - np.diag(logits))
  got = float(mocov3.alignment_loss(tf.constant(local, tf.float32), tf.constant(glob, tf.float32),
                                    0.2))
  assert got == pytest.approx(want, rel=1e-5)


def test_client_loss_adds_beta_times_alignment_of_local_and_broadcast_features():
  cfg = config("lw_fedssl", depth=1)
  train = synthetic("train", num_examples=4, seed=0)
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(runner.ssl_model_builder(cfg, train.image_shape, features=True))
  fcfg = ClientConfig(ssl="mocov3", hparams=Hparams(temperature=0.2),
                      terms=(alignment.RepresentationAlignment(0.01, 0.2),))
  v1, v2 = common.views(common.client_inputs(train.images, np.arange(4)), np.array([0, 0]),
                        fcfg.augment)
  start = [tf.constant(w) for w in model.initial_weights]
  moved = [w + 0.01 * tf.random.stateless_normal(w.shape, [1, i]) for i, w in enumerate(start)]
  for local in (start, moved):  # local = global (a client's first step), then apart.
    out = client_work.view_outputs(model, fcfg.method, local, None, v1, v2)
    glob = model(start, v2)[-1].numpy()
    h1 = out.h1.numpy()
    l = h1 / np.linalg.norm(h1, axis=1, keepdims=True)
    g = glob / np.linalg.norm(glob, axis=1, keepdims=True)
    logits = l @ g.T / 0.2
    align = np.mean(np.log(np.exp(logits).sum(1)) - np.diag(logits))
    want = float(fcfg.method.loss(out, fcfg.hparams)) + 0.01 * align
    step = client_work.Step(model, out, start, local, v1, v2)
    assert float(client_work.client_loss(fcfg, step)) == pytest.approx(want, rel=1e-5)
    if local is start:  # The global representations are the local ones of view 2.
      np.testing.assert_allclose(glob, out.h2.numpy(), rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def lw_fedssl_run():
  return run("lw_fedssl")


def test_calibration_changes_only_the_servers_copy(lw_fedssl_run):
  process, model, states = lw_fedssl_run
  cfg = config("lw_fedssl")
  # The same process without calibration, from LW-FedSSL's state at stage 2's first round.
  plain = layerwise.LayerwiseProcess(
      cfg, model, process.image_shape,
      layerwise.LayerwiseConfig(calibration=False, alignment=True),
      lambda s: runner.ssl_model_builder(dataclasses.replace(cfg, depth=s), process.image_shape,
                                         features=True))
  train = synthetic("train", num_examples=24, seed=0)
  clients = [common.client_inputs(train.images[i:i + 4], np.arange(i, i + 4)) for i in (0, 4, 8)]
  uncalibrated, plain_metrics = plain.next(states[2], clients)
  calibrated, metrics = process.next(states[2], clients)
  # The clients' side is untouched: same losses, and the round's aggregate leaves block 1 frozen...
  assert plain_metrics["loss"] == metrics["loss"]
  np.testing.assert_array_equal(np.concatenate([t.ravel() for t in tensors(model, [uncalibrated], 0, 1)]),
                                np.concatenate([t.ravel() for t in tensors(model, states, 2, 1)]))
  # ...and the server's copy is that aggregate after the calibration's training of blocks 1..2 and
  # the heads on the auxiliary images.
  names = process.stage_models[1].names
  index = {n: i for i, n in enumerate(model.names)}
  want, _ = process.calibrator(2)([uncalibrated.weights[index[n]] for n in names],
                                  common.round_seed(0, 2), process.auxiliary["images"],
                                  process.auxiliary["ids"])
  for n, w in zip(names, want):
    np.testing.assert_array_equal(calibrated.weights[index[n]], np.asarray(w))
  assert any(not np.array_equal(a, b) for a, b in zip(tensors(model, [calibrated], 0, 1),
                                                      tensors(model, states, 2, 1)))
  assert np.isfinite(metrics["aggregation"]["calibration_loss"])
  # The clients upload block 2 and the heads only (block 1 is the server's to calibrate).
  assert not any(n.startswith("encoder/block1_") for n in process.process(2).mask.select(names))


def test_a_skipped_block_is_the_identity():
  shape = (28, 28, 1)
  tf.keras.utils.set_random_seed(0)
  two = FunctionalModel(lambda: vit.build_vit("vit_mini", shape, depth=2, patch_size=7, width=0.5))
  one = FunctionalModel(lambda: vit.build_vit("vit_mini", shape, depth=1, patch_size=7, width=0.5))
  w = dict(zip(two.names, two.initial_weights))
  # The one-block model with the two-block model's block 2 as its block 1.
  w1 = [w[n.replace("block1_", "block2_")] for n in one.names]
  x = tf.random.stateless_uniform((3,) + shape, [0, 1])
  with vit.block_keep(tf.constant([False])):
    skipped = two(two.initial_weights, x)
  np.testing.assert_allclose(skipped.numpy(), one(w1, x).numpy(), rtol=1e-6, atol=1e-6)
  with vit.block_keep(tf.constant([True])):
    np.testing.assert_array_equal(two(two.initial_weights, x).numpy(),
                                  two(two.initial_weights, x).numpy())


def test_depth_dropout_drops_only_frozen_blocks(layerwise_run):
  _, model, lw_states = layerwise_run
  _, _, dd_states = run("fll_dd")
  # Stage 1 has no frozen block: FLL + DD's rounds are FedMoCo-LW's.
  for r in (1, 2):
    for a, b in zip(dd_states[r].weights, lw_states[r].weights):
      np.testing.assert_array_equal(a, b)
  # Stage 2 skips block 1 at some local steps: block 2 trains otherwise.
  assert any(not np.array_equal(a, b) for a, b in zip(tensors(model, dd_states, 4, 2),
                                                      tensors(model, lw_states, 4, 2)))
  for a, b in zip(tensors(model, dd_states, 4, 1), tensors(model, dd_states, 2, 1)):
    np.testing.assert_array_equal(a, b)  # Frozen all the same.
