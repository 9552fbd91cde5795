"""FedU (Zhuang et al., ICCV 2021): FedBYOL whose clients take the global predictor only when their
online encoder has diverged from the global one by less than `fedu_threshold` (0.4, the public
code's); otherwise they keep their own predictor (`tff_ssl.methods.fedssl`). With SimCLR or
Barlow Twins (`--ssl=simclr|cco`: L-DAWA's Table 2 rows FedU and L-DAWA_FedU, the latter with
`--aggregator=ldawa_fedavg`) the projector is the head kept or taken."""

from tff_ssl.methods import fedssl

METHOD = fedssl.method(
    "fedu", lambda config: fedssl.StatefulConfig(online_update="fedu",
                                                 threshold=config.fedu_threshold,
                                                 divergence=config.divergence_measure),
    "FedU: FedBYOL with the divergence-aware predictor update.",
    fields=(fedssl.FEDU_THRESHOLD, fedssl.DIVERGENCE_MEASURE), ssl=("byol", "simclr", "cco"))
