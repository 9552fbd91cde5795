"""MoCo v3 (Chen, Xie and He, 2021), LW-FedSSL's client SSL method: an online encoder + projector +
predictor and a momentum (target) encoder + projector, the EMA of the online ones over local steps
(`target_decay`, 0.99 in LW-FedSSL); the loss contrasts each view's prediction with the momentum
projections of the other view of every image in the batch (`tff_ssl.losses.mocov3`, temperature 0.2
in LW-FedSSL: `--temperature=0.2`). No queue. The paper's heads are a 3-layer projector and a 2-layer
predictor, hidden 4096, output 256 (`--projector=4096,4096,256 --predictor=4096,256`); MoCo v3's heads
have BatchNorm, ours GroupNorm (batch-free, as every model here).
"""

from __future__ import annotations

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
