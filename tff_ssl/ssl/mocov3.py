"""MoCo v3 (Chen, Xie and He, 2021), LW-FedSSL's client SSL method: an online encoder + projector +
predictor and a momentum (target) encoder + projector, the EMA of the online ones over local steps
(`target_decay`, 0.99 in LW-FedSSL); the loss contrasts each view's prediction with the momentum
projections of the other view of every image in the batch (`tff_ssl.losses.mocov3`, temperature 0.2
in LW-FedSSL: `--temperature=0.2`). No queue. The paper's heads are a 3-layer projector and a 2-layer
predictor, hidden 4096, output 256 (`--projector=4096,4096,256 --predictor=4096,256`); MoCo v3's heads
have BatchNorm (`--head_norm=batch`), the default heads here GroupNorm (batch-free).

`vit_recipe(federated)`: MoCo v3's training of ViTs (its Section 4 and public configs), as the fields
that set it: AdamW with decoupled weight decay 0.1, a linear warm-up then cosine decay over the whole
run (40 of 300 epochs in the paper; here a tenth of the steps or rounds), batch-statistics heads.
MoCo v3's freezing of the patch projection at its random initialization is an option beside it
(`--freeze_patch_embed`), off in the recipe: LW-FedSSL trains the patch projection ("we follow MoCo
v3, except that we train the patch projection layer"). Federated, the clients' optimizer follows it
(`client_lr_schedule=warmup_cosine`: the rate is a function of the round and the local step, across
rounds, stages and resumes). The ViT tables and gate start from it; a flag's default never changes
with another flag, so `--encoder=vit_mini` alone does not turn it on.
"""

from __future__ import annotations

from typing import Any

from tff_ssl import losses
from tff_ssl.losses import per_client
from tff_ssl.ssl.base import SSLMethod

METHOD = SSLMethod(
    name="mocov3",
    loss=lambda o, hp: losses.mocov3_loss(o.p1, o.p2, o.t1, o.t2, hp.temperature),
    per_client_loss=lambda o, sizes, hp: per_client.mocov3_loss_per_client(
        o.p1, o.p2, o.t1, o.t2, sizes, hp.temperature),
    predictor=True, ema_target=True, min_samples=2,
    hparams=("temperature", "target_decay", "predictor"),
    # --head_norm=batch: MoCo v3: BN on every projector layer, the output's non-affine; BN on the
    # predictor's hidden layer.
    batch_heads="hidden+output")


VIT_WEIGHT_DECAY = 0.1  # MoCo v3's ViTs (AdamW).
VIT_WARMUP_FRACTION = 0.1  # Of the run (the paper: 40 of 300 epochs on ImageNet).


def vit_recipe(federated: bool) -> dict[str, Any]:
  """The config fields of MoCo v3's ViT recipe (module docstring), for centralized pretraining or
  (`federated`) for FedAvg-style clients; the learning rate and the run's length are the caller's."""
  shared = {"ssl": "mocov3", "head_norm": "batch", "warmup_fraction": VIT_WARMUP_FRACTION}
  if federated:
    return {**shared, "client_optimizer": "adamw", "client_weight_decay": VIT_WEIGHT_DECAY,
            "client_lr_schedule": "warmup_cosine"}
  return {**shared, "optimizer": "adamw", "weight_decay": VIT_WEIGHT_DECAY}
