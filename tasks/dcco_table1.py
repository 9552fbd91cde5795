"""DCCO (Vemulapalli et al., 2023), Table 1: CIFAR-100, linear evaluation and full fine-tuning.

Rows: CCO + FedAvg, Contrastive + FedAvg, DCCO, centralized CCO, centralized contrastive (not in the
paper: the contrastive rows' bound, as centralized CCO is DCCO's), supervised from scratch. Columns:
total clients / samples per client / clients per round at a fixed global batch, non-IID (alpha = 0, one
class per client) and IID (alpha = 1000). Evaluations: linear probe on 10% and 1% of the labels, full
fine-tuning on 10% (Appendix B's protocols).

  paper  CIFAR-100 (tfds), ResNet-14 (WS + GroupNorm), projectors [1024]*3 (CCO) and [256, 256, 128]
         (contrastive, temperature 0.1), 100K rounds of global batch 512, server Adam with cosine decay
         from 5e-3 or 1e-3 (the paper kept the better; here chosen on a validation split), client
         gradient descent with learning rate 1.0 and one local step; centralized CCO 1000 epochs of
         batch 512 (97K steps); supervised from scratch 100 epochs, Adam 0.01. Built for a GPU.
  mini   the same grid in the mini regime of the gated tables (docs/mini_regime.md): shifted
         Fashion-MNIST (60K train images, Debian's files), global batch 128, ResNet-14 with a
         stride-2 stem and 2 x 2 grid pooling (256 features), projectors [512]*3 and [128, 128, 64],
         crops >= 50%, lambda = 2, MINI_ROUNDS rounds (the centralized gate's length); plus
         DCCO-VICReg and centralized VICReg (the statistics loss that scored best, issue 36), and
         the non-IID columns of CCO + FedAvg, Contrastive + FedAvg and DCCO again at training seed
         1. Every federated row's server learning rate from the same candidates and pilot budget.
         Evaluations: the tuned probe at 10% and 1% of the labels, label seeds 0 / 1; the gate reads
         the 10% probe. Supervised from scratch 30 epochs on each label subset. Takes more than one
         session on 2 CPU cores; it resumes.

The paper's claims about these rows (`CLAIMS`, each with its source) are checked on our numbers where
the cells they compare pass the gate.
"""

from __future__ import annotations

import dataclasses

from tff_ssl import evaluation
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.tables import (FAILED, TUNED_1_TWO_SEEDS, TUNED_10_TWO_SEEDS, TUNED_GATE, Claim,
                            Column, Evaluation, Row, Table)

NAME = "dcco_table1"
TITLE = "DCCO Table 1: federated self-supervised pretraining, then 10% / 1% labels"

EVALUATIONS = (
    Evaluation("linear_10", "Linear evaluation, 10% labels", evaluation.LinearProbeConfig(
        label_fraction=0.1, steps=1000, batch_size=512, optimizer="lars", learning_rate=2.0)),
    Evaluation("finetune_10", "Full fine-tuning, 10% labels", evaluation.FineTuneConfig(
        label_fraction=0.1, steps=100, batch_size=256, optimizer="adam", learning_rate=5e-3)),
    Evaluation("linear_1", "Linear evaluation, 1% labels", evaluation.LinearProbeConfig(
        label_fraction=0.01, steps=400, batch_size=128, optimizer="lars", learning_rate=2.5)),
)

# The paper's Table 1 (percent). Columns: non-IID 1/4/8/16 samples per client, IID 4/8/16.
_NON_IID = ("noniid_1", "noniid_4", "noniid_8", "noniid_16")
_IID = ("iid_4", "iid_8", "iid_16")


def _paper_numbers(keys: dict[str, tuple[str, ...]] | None = None
                   ) -> dict[tuple[str, str, str], float | str]:
  """{(evaluation, row, column): the paper's number}; `keys` maps the paper's evaluations to ours
  where they differ (the mini scale's tuned probe at each label seed beside the paper's linear
  evaluation of the same label fraction)."""
  numbers: dict[tuple[str, str, str], float | str] = {}
  grid = {
      "linear_10": {
          "fedavg_cco": [None, FAILED, 28.7, 30.7, FAILED, 41.2, 44.1],
          "fedavg_simclr": [None, 31.1, 32.4, 31.8, 41.1, 44.1, 46.4],
          "dcco": [51.7, 49.6, 48.1, 45.9, 51.4, 52.0, 51.9],
          "centralized_cco": 52.6, "supervised": 42.4},
      "finetune_10": {
          "fedavg_cco": [None, FAILED, 36.3, 38.9, FAILED, 43.0, 46.0],
          "fedavg_simclr": [None, 40.8, 41.8, 41.3, 44.9, 46.8, 47.4],
          "dcco": [51.5, 50.5, 49.3, 47.7, 51.5, 52.1, 52.0],
          "centralized_cco": 52.5, "supervised": 42.4},
      "linear_1": {
          "fedavg_cco": [None, FAILED, 13.5, 14.5, FAILED, 26.2, 27.6],
          "fedavg_simclr": [None, 14.8, 15.6, 15.0, 24.7, 27.8, 29.3],
          "dcco": [33.3, 31.2, 29.5, 26.7, 33.3, 33.5, 33.5],
          "centralized_cco": 34.0, "supervised": 13.1},
  }
  for paper_key, rows in grid.items():
    for ev in (keys or {}).get(paper_key, (paper_key,)):
      for row, values in rows.items():
        if isinstance(values, list):
          for column, v in zip(_NON_IID + _IID, values):
            if v is not None:
              numbers[(ev, row, column)] = v
        else:
          numbers[(ev, row, "")] = values
  return numbers


def columns(num_images: int, global_batch: int) -> tuple[Column, ...]:
  cols = []
  for group, alpha, sizes in (("non-IID", 0.0, (1, 4, 8, 16)), ("IID", 1000.0, (4, 8, 16))):
    for s in sizes:
      key = f"{'noniid' if alpha == 0 else 'iid'}_{s}"
      cols.append(Column(key, group, num_images // s, s, global_batch // s, alpha))
  return tuple(cols)


def _rows(base: ExperimentConfig, *, cco_projector, contrastive_projector, rounds: int,
          global_batch: int, learning_rates, supervised_batch: int) -> tuple[Row, ...]:
  fed = dataclasses.replace(base, rounds=rounds, local_steps=1, client_optimizer="sgd",
                            client_learning_rate=1.0, server_optimizer="adam")
  return (
      Row("fedavg_cco", "CCO + FedAvg", dataclasses.replace(
          fed, method="fedavg", ssl="cco", projector=cco_projector), learning_rates),
      Row("fedavg_simclr", "Contrastive + FedAvg", dataclasses.replace(
          fed, method="fedavg", ssl="simclr", projector=contrastive_projector, temperature=0.1),
          learning_rates),
      Row("dcco", "DCCO", dataclasses.replace(fed, method="dcco", projector=cco_projector),
          learning_rates),
      # One centralized step = one round (the same images per update, the same number of updates),
      # at DCCO's chosen learning rate: with one sample per client the two are the same algorithm.
      Row("centralized_cco", "Centralized CCO", dataclasses.replace(
          base, method="centralized", ssl="cco", projector=cco_projector, steps=rounds,
          batch_size=global_batch, optimizer="adam"), learning_rates, select_with="dcco"),
      _centralized_contrastive(base, contrastive_projector, rounds, global_batch, learning_rates),
      Row("supervised", "Supervised from scratch", dataclasses.replace(
          base, method="supervised", batch_size=supervised_batch, optimizer="adam",
          learning_rate=0.01)),
  )


def _centralized_contrastive(base: ExperimentConfig, projector, steps: int, batch: int,
                             learning_rates) -> Row:
  """Contrastive pretraining on the pooled data, one step per round at Contrastive + FedAvg's chosen
  learning rate: the contrastive rows' bound (the paper has no such row)."""
  return Row("centralized_simclr", "Centralized contrastive", dataclasses.replace(
      base, method="centralized", ssl="simclr", projector=projector, temperature=0.1, steps=steps,
      batch_size=batch, optimizer="adam"), learning_rates, select_with="fedavg_simclr")


# Where the paper makes its claims about Table 1's rows.
OUTPERFORMS_FEDAVG = (
    'Sec. 4.1 on Table 1: "The proposed DCCO approach outperforms the FedAvg variants of contrastive '
    'and CCO loss-based training by a significant margin for both IID and non-IID client datasets" '
    '(11-18 points non-IID, 4-10 IID, linear evaluation)')
NEAR_CENTRALIZED = (
    'footnote 3: with one sample per client DCCO "should be close to the performance of centralized '
    'CCO" (the paper measures a ~1% gap); Table 1: DCCO 45.9-52.0 against centralized CCO 52.6 '
    '(10% labels, linear)')
OUTPERFORMS_SUPERVISED = (
    'Sec. 4.1: "The proposed DCCO approach also outperforms fully-supervised training from scratch '
    'by a significant margin (10-20%)"')
VICREG_EXACT = (
    "not the paper's: this project's (issue 36), DCCO trains any statistics loss with the "
    "centralized gradient (the paper names VICReg as an open question), so DCCO-VICReg should be "
    "as near centralized VICReg as DCCO is to centralized CCO")
WITHIN = 3.0  # Points: "close to" centralized, the ~1% of footnote 3 with room for a 10-class set.


def claims(*evaluation_sets: tuple[tuple[str, ...], str],
           seed_rows: tuple[tuple[str, str], ...] = ()) -> tuple[Claim, ...]:
  """The paper's claims about Table 1's rows (and DCCO-VICReg's, the mini scale's extension), at each
  of `evaluation_sets` ((evaluation keys, label); () keys: the gate's); with `seed_rows`, the same
  claims between the rows' training-seed-1 counterparts."""
  seed1 = dict(seed_rows)
  out = []
  for keys, what in evaluation_sets:
    for suffix in ("", "_seed1"):  # The seed-1 rows' names say so.
      dcco = "dcco" + suffix
      if suffix and dcco not in seed1.values():
        continue
      tag = what
      rival = (lambda k: seed1[k]) if suffix else (lambda k: k)
      out += [Claim(dcco, rival("fedavg_cco"), OUTPERFORMS_FEDAVG, evaluations=keys, label=tag),
              Claim(dcco, rival("fedavg_simclr"), OUTPERFORMS_FEDAVG, evaluations=keys,
                    label=tag),
              Claim(dcco, "centralized_cco", NEAR_CENTRALIZED, relation="within", within=WITHIN,
                    evaluations=keys, label=tag),
              Claim(dcco, "supervised", OUTPERFORMS_SUPERVISED, evaluations=keys, label=tag)]
  return tuple(out)


def paper() -> Table:
  base = ExperimentConfig(method="dcco", dataset="cifar100", encoder="resnet14", width=1.0,
                          crop_min_scale=0.08, blur=False, cco_lambda=20.0, checkpoint_every=1000,
                          log_every=100, seed=0)
  return Table(
      name=NAME, scale="paper", title=TITLE,
      rows=_rows(base, cco_projector=(1024, 1024, 1024), contrastive_projector=(256, 256, 128),
                 rounds=100_000, global_batch=512, learning_rates=(5e-3, 1e-3),
                 supervised_batch=256)[:3] + (
          # Centralized: 1000 epochs of batch 512 over 50K images (97K steps), Adam 5e-3 (App. B).
          Row("centralized_cco", "Centralized CCO", dataclasses.replace(
              base, method="centralized", ssl="cco", projector=(1024, 1024, 1024), steps=97_000,
              batch_size=512, optimizer="adam", learning_rate=5e-3), (5e-3, 1e-3),
              select_with="dcco"),
          _centralized_contrastive(base, (256, 256, 128), 97_000, 512, (5e-3, 1e-3)),
          Row("supervised", "Supervised from scratch", dataclasses.replace(
              base, method="supervised", batch_size=256, optimizer="adam", learning_rate=0.01)),
      ),
      columns=columns(50_000, 512), evaluations=EVALUATIONS, paper=_paper_numbers(),
      curve_every=10_000, selection_column="noniid_16", supervised_epochs=100,
      claims=claims(((), ""), (("linear_1",), "1% labels"), (("finetune_10",), "fine-tuning")),
      notes=("Paper scale: built for a GPU; on a CPU it constructs and runs (see --max_rounds).",))


# The mini scale (issue 50): the regime of the gated tables (docs/mini_regime.md) on shifted
# Fashion-MNIST, the tuned probe at 10% and 1% of the labels and two label seeds, the centralized
# gate's length, one candidate grid and one pilot budget for every federated row.
MINI_ROUNDS = 1000
MINI_DATASET = "fashion_mnist_shifted"
MINI_LEARNING_RATES = (5e-4, 1e-3, 2e-3, 5e-3)
# Pilots as long as the runs: pilots of a quarter of the rounds chose the largest rate for DCCO
# (validation probe 57.6 at 5e-3 against 51.8 at 1e-3 after 250 rounds), where 1,000 rounds end the
# other way round (issue 36's diagnostic: 71.9 at 1e-3 against 66.2 at 5e-3, tuned probe): a short
# pilot favours the rate that learns fastest, not the one that ends best.
MINI_PILOT_FRACTION = 1.0
MINI_EVALUATIONS = TUNED_10_TWO_SEEDS + TUNED_1_TWO_SEEDS
# The claims' evaluations: the gate's (10% of the labels, both label seeds), then 1%.
MINI_CLAIM_EVALUATIONS = (((), ""), (tuple(e.key for e in TUNED_1_TWO_SEEDS), "1% labels"))
# The rows that also run with training seed 1 in the non-IID columns: (row, its seed-1 row).
SEED_ROWS = (("fedavg_cco", "fedavg_cco_seed1"), ("fedavg_simclr", "fedavg_simclr_seed1"),
             ("dcco", "dcco_seed1"))


def _mini_rows(base: ExperimentConfig) -> tuple[Row, ...]:
  rows = _rows(base, cco_projector=(512, 512, 512), contrastive_projector=(128, 128, 64),
               rounds=MINI_ROUNDS, global_batch=128, learning_rates=MINI_LEARNING_RATES,
               supervised_batch=256)
  by = {r.key: r for r in rows}
  dcco = by["dcco"]
  vicreg = Row("dcco_vicreg", "DCCO-VICReg", dataclasses.replace(dcco.config, ssl="vicreg"),
               MINI_LEARNING_RATES)
  central_vicreg = Row("centralized_vicreg", "Centralized VICReg", dataclasses.replace(
      by["centralized_cco"].config, ssl="vicreg"), MINI_LEARNING_RATES, select_with="dcco_vicreg")
  non_iid = tuple(k for k in _NON_IID)
  seed1 = tuple(Row(key1, f"{by[key].name}, training seed 1", dataclasses.replace(
      by[key].config, seed=1), MINI_LEARNING_RATES, select_with=key, columns=non_iid)
      for key, key1 in SEED_ROWS)
  return (by["fedavg_cco"], by["fedavg_simclr"], dcco, vicreg, by["centralized_cco"],
          by["centralized_simclr"], central_vicreg, by["supervised"]) + seed1


def mini() -> Table:
  # The mini regime (tasks/mini_regime.py, docs/mini_regime.md): grid pooling, crops >= 50%,
  # lambda = 2, on the shifted Fashion-MNIST where the centralized gate's rows clear raw pixels.
  base = ExperimentConfig(method="dcco", dataset=MINI_DATASET, encoder="resnet14", width=1.0,
                          stem_stride=2, pool_grid=2, crop_min_scale=0.5, blur=False,
                          cco_lambda=2.0, checkpoint_every=250, log_every=10, seed=0)
  return Table(
      name=NAME, scale="mini", title=TITLE, rows=_mini_rows(base),
      columns=columns(60_000, 128), evaluations=MINI_EVALUATIONS,
      paper=_paper_numbers({"linear_10": TUNED_GATE,
                            "linear_1": tuple(e.key for e in TUNED_1_TWO_SEEDS)}),
      curve_every=MINI_ROUNDS // 2, selection_column="noniid_16", supervised_epochs=30,
      pilot_fraction=MINI_PILOT_FRACTION, gate_evaluations=TUNED_GATE,
      claims=claims(*MINI_CLAIM_EVALUATIONS, seed_rows=SEED_ROWS) + tuple(
          Claim("dcco_vicreg", "centralized_vicreg", VICREG_EXACT, relation="within", own=True,
                within=WITHIN, evaluations=keys, label=what)
          for keys, what in MINI_CLAIM_EVALUATIONS),
      notes=(f"Mini scale, in the mini regime: shifted Fashion-MNIST (10 classes) instead of "
             f"CIFAR-100 (100 classes), {MINI_ROUNDS} rounds of 128 images instead of 100K of 512, "
             f"ResNet-14 with a stride-2 stem and 2 x 2 grid pooling, crops >= 50%, lambda = 2: "
             f"compare orderings and gaps with the paper's, not absolute numbers.",
             "Every federated row's server learning rate is chosen from the same candidates "
             f"({', '.join(f'{lr:g}' for lr in MINI_LEARNING_RATES)}) by pilots as long as the "
             "runs, on the training split less a held-out 10% validation split (scored there with "
             "the runs' LARS probe); each centralized row takes its federated counterpart's choice, "
             "each training-seed-1 row its seed-0 row's.",
             "Evaluations: the tuned probe at 10% and 1% of the labels, label seeds 0 and 1 (the "
             "paper's full fine-tuning is left out at this scale); the supervised row trains from "
             "scratch on each label subset."))


SCALES = {"mini": mini, "paper": paper}
