"""FedBYOL (Zhuang et al., ICLR 2022, the generalized framework with BYOL): every round a client's online
network (encoder, projector, predictor) is replaced by the global one; its BYOL target network stays
on the client across rounds (`tff_ssl.methods.fedssl`)."""

from tff_ssl.methods import fedssl

METHOD = fedssl.method(
    "fedbyol", lambda config: fedssl.StatefulConfig(),
    "FedBYOL: global online network each round, the client's own BYOL target kept across rounds.")
