"""Supervised SimCSE: contrastive learning on NLI, each premise's contradiction a hard negative."""
from __future__ import annotations

import torch

from ..data.negatives import read_triplets
from ..data.nli import nli_triples, read_nli
from ..data.pairs import pair_kind
from ..errors import DataError, UsageError
from ..data.examples import Examples
from .base import pair_scalars
from .contrastive import InfoNCE
from .mirror import simcse_mlp
from .settings import InfoNCESettings, MatryoshkaSettings
from .supervised import Supervised, train_files


class SupervisedSimCSE(Supervised):
    """Supervised SimCSE (Gao et al. 2021, "SimCSE: Simple Contrastive Learning of Sentence
    Embeddings", EMNLP, section 4).

    Inputs: triples (x, x+, x-) from NLI: a premise, a hypothesis it entails (the positive) and
    one it contradicts (the hard negative; ``data.nli.nli_triples``). With h = f(x), h+ = f(x+),
    h- = f(x-) [b, D] from one forward pass (dropout on, as in training):

        loss = InfoNCE(h, h+, hard negatives h-): the cross-entropy of the softmax over each
        anchor's candidates, cosine / --temperature (0.05), every h+_j and every h-_j of the
        batch; --negatives report adds the other anchors h_j (the report's variant, the default),
        --negatives simcse is the published loss (``--preset simcse-sup``). Under torch.distributed
        the candidates come from the global batch.

    Settings: ``InfoNCESettings``, ``MatryoshkaSettings``; ``mlp=True`` (``--pooling cls-mlp``): SimCSE's MLP over [CLS] in
    training (h = tanh(W [CLS] + c)); the encoder and its checkpoint keep [CLS] without it.

    ``--mini-batch-size``: the three columns go through the encoder M rows at a time with the
    gradient cache (``objectives.cache``), so its batch 512 fits in the memory of M rows.
    """

    mini_batches = True
    no_duplicates = True  # a premise recurs in its triples: as another row's negative it would be a false one
    SETTINGS = (InfoNCESettings, MatryoshkaSettings)
    RUN_SETTINGS = ("mlp",)

    def __init__(self, encoder, *, mlp: bool = False, **settings):
        super().__init__(encoder, **settings)
        self.info_nce = InfoNCE(temperature=self.settings.temperature, negatives=self.settings.negatives)
        self.mlp = simcse_mlp(encoder, mlp)
        self.matryoshka_widths(encoder.output_dim)

    @classmethod
    def read_examples(cls, config, corpus) -> Examples:
        files = train_files(config)
        kinds = {f: pair_kind(f) for f in files}
        other = [f"{f} ({kind})" for f, kind in kinds.items() if kind not in ("nli", "triplets")]
        if other or len(set(kinds.values())) > 1:
            raise UsageError(f"--method simcse-sup trains on NLI files or on (anchor, positive, negative) triplets "
                             f"(python -m bertcf.data mine-negatives), of one kind: {', '.join(other) or 'mixed'}")
        if "triplets" in kinds.values():
            triples = [t for f in files for t in read_triplets(f)]
            return Examples([list(c) for c in zip(*triples)], None, (),
                            f"{len(triples):,} (anchor, positive, mined negative) triplets from "
                            f"{', '.join(map(str, files))}")
        examples = [e for f in files for e in read_nli(f)]
        triples = nli_triples(examples)
        if not triples:
            raise DataError(f"{', '.join(map(str, files))}: no premise has both an entailed and a contradicted "
                            f"hypothesis, so there are no triples for supervised SimCSE")
        anchors, positives, negatives = (list(column) for column in zip(*triples))
        return Examples([anchors, positives, negatives], None, (),
                        f"{len(triples):,} (premise, entailment, contradiction) triples from "
                        f"{', '.join(map(str, files))}")

    def checkpoint_modules(self):
        return {"encoder": self.encoder} | ({"mlp": self.mlp} if self.mlp is not None else {})

    def views(self, ids, mask, rank: int, world: int) -> list[torch.Tensor]:
        """h, h+, h- [b, D] of this rank's rows (after the MLP with cls-mlp)."""
        h = torch.cat(self.column_embeddings(ids, mask, 3, rank, world))
        return list((self.mlp(h) if self.mlp is not None else h).chunk(3))

    def loss(self, ids, mask, special, rank=0, world=1, labels=None):
        anchors, positives, negatives = self.views(ids, mask, rank, world)
        loss = self.at_widths(lambda v, _: self.info_nce(*v), [anchors, positives, negatives])
        with torch.no_grad():
            scalars = pair_scalars(anchors, positives)
            scalars["hard_negative_cosine"] = torch.nn.functional.cosine_similarity(
                anchors.float(), negatives.float()).mean()
        return loss, scalars
