"""BYOL (Grill et al., 2020): the online prediction of one view regresses the target projection of the
other; the target network is the EMA of the online one (decay `target_decay`) over the client's local
steps, started each round from the broadcast model (FedAvg-style BYOL keeps no state on clients; the
stateful FedBYOL / FedEMA family is a later strategy). Online encoder, projector and predictor are
uploaded and averaged.
"""

from __future__ import annotations

from tff_ssl import losses
from tff_ssl.losses import per_client
from tff_ssl.ssl.base import SSLMethod

METHOD = SSLMethod(
    name="byol",
    loss=lambda o, hp: losses.byol_loss(o.p1, o.p2, o.t1, o.t2),
    per_client_loss=lambda o, sizes, hp: per_client.byol_loss_per_client(
        o.p1, o.p2, o.t1, o.t2, sizes),
    predictor=True, ema_target=True, min_samples=1, hparams=("target_decay", "predictor"),
    # --head_norm=batch: BYOL: projector and predictor Linear-BN-ReLU-Linear.
    batch_heads="hidden")
