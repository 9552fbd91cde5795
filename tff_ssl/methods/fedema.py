"""FedEMA (Zhuang et al., ICLR 2022): a client's online encoder and predictor start each round as
mu W_k + (1 - mu) W_g, mu = min(lambda_k ||W_g - W_k||, 1), lambda_k constant (`fedema_lambda`, the
paper's 0.8) or, by default, the autoscaler tau / ||W_g - W_k|| fixed where first known
(`fedema_tau`, the paper's 0.7; the public code's 0.8). `tff_ssl.methods.fedssl` has the details
and the public code's divergence (`--divergence_measure=code`)."""

from tff_ssl.methods import fedssl

METHOD = fedssl.method(
    "fedema", lambda config: fedssl.StatefulConfig(online_update="ema",
                                                   ema_lambda=config.fedema_lambda,
                                                   ema_tau=config.fedema_tau,
                                                   divergence=config.divergence_measure),
    "FedEMA: divergence-aware EMA of the global and the client's own online network.",
    fields=(fedssl.FEDEMA_LAMBDA, fedssl.FEDEMA_TAU, fedssl.DIVERGENCE_MEASURE))
