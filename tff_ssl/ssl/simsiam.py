"""SimSiam (Chen & He, 2021): the prediction of one view regresses the stop-gradient projection of the
other view, from the same (online) network: BYOL without a moving-average target.
"""

from __future__ import annotations

from tff_ssl import losses
from tff_ssl.losses import per_client
from tff_ssl.ssl.base import SSLMethod

METHOD = SSLMethod(
    name="simsiam",
    loss=lambda o, hp: losses.simsiam_loss(o.p1, o.p2, o.z1, o.z2),
    per_client_loss=lambda o, sizes, hp: per_client.simsiam_loss_per_client(
        o.p1, o.p2, o.z1, o.z2, sizes),
    predictor=True, min_samples=1, hparams=("predictor",),
    # --head_norm=batch: SimSiam: BN on every projector layer, the output's without affine (He's
    # code: `BatchNorm1d(dim, affine=False)`); predictor Linear-BN-ReLU-Linear.
    batch_heads="hidden+output")
