"""MoCo (He et al., 2020; v2: Chen et al., 2020): the online projection of one view is contrasted with
the momentum (target) network's projection of the other view against a queue of `moco_queue` earlier
keys (`tff_ssl.losses.moco`), symmetrized over the views. The momentum network is the EMA of the online
one over local steps (decay `target_decay`), as BYOL's target. v1 and v2 differ in the projection head
(linear vs MLP: `--projector`) and the temperature (0.07 vs 0.2: `--temperature`) and augmentations.
FedAvg-style clients start each round with the broadcast model as momentum network and a zero queue;
FedMoCo's clients keep both between rounds (`tff_ssl.methods.fedmoco`).
"""

from __future__ import annotations

from tff_ssl import losses
from tff_ssl.losses import per_client
from tff_ssl.ssl.base import SSLMethod

METHOD = SSLMethod(
    name="moco",
    loss=lambda o, hp: losses.moco_loss(o.z1, o.z2, o.t1, o.t2, o.queue, hp.temperature),
    per_client_loss=lambda o, sizes, hp: per_client.moco_loss_per_client(
        o.z1, o.z2, o.t1, o.t2, o.queue, sizes, hp.temperature),
    ema_target=True, queue=True, min_samples=1,
    hparams=("temperature", "target_decay", "moco_queue"),
    # --head_norm=batch: MoCo v2's head is Linear-ReLU-Linear, with no normalization (its BN is in
    # the encoder, shuffled across GPUs).
    batch_heads="none")
