"""Supervised SimCSE: contrastive learning on NLI, each premise's contradiction a hard negative."""
from __future__ import annotations

import torch

from ..data.negatives import beir_pairs, read_query_pairs, read_triplets
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

    Also (anchor, positive, negative) triplets of mined negatives (``python -m bertcf.data
    mine-negatives``), and (query, positive) pairs without a hard negative: a ``query<TAB>positive``
    file under that header, or a set in BEIR's layout (its qrels/train.tsv: GenQ's queries,
    ``python -m bertcf.data genq``). On pairs, with --negatives simcse, the loss is InfoNCE over
    the batch's positives alone: sentence-transformers' MultipleNegativesRankingLoss (MNRL) at
    scale 1 / --temperature, what GenQ trains with (``hard_negatives=False``; a run sets it from
    its examples, ``from_examples``).

    Settings: ``InfoNCESettings``, ``MatryoshkaSettings``; ``mlp=True`` (``--pooling cls-mlp``): SimCSE's MLP over [CLS] in
    training (h = tanh(W [CLS] + c)); the encoder and its checkpoint keep [CLS] without it.

    ``--mini-batch-size``: the three columns go through the encoder M rows at a time with the
    gradient cache (``objectives.cache``), so its batch 512 fits in the memory of M rows.
    """

    mini_batches = True
    no_duplicates = True  # a premise recurs in its triples: as another row's negative it would be a false one
    SETTINGS = (InfoNCESettings, MatryoshkaSettings)
    RUN_SETTINGS = ("mlp",)

    def __init__(self, encoder, *, mlp: bool = False, hard_negatives: bool = True, **settings):
        super().__init__(encoder, **settings)
        self.columns = 3 if hard_negatives else 2  # (anchor, positive[, negative])
        self.info_nce = InfoNCE(temperature=self.settings.temperature, negatives=self.settings.negatives)
        self.mlp = simcse_mlp(encoder, mlp)
        self.matryoshka_widths(encoder.output_dim)

    @classmethod
    def read_examples(cls, config, corpus) -> Examples:
        files = train_files(config)
        kinds = {f: pair_kind(f) for f in files}
        other = [f"{f} ({kind})" for f, kind in kinds.items() if kind not in ("nli", "triplets", "pairs", "beir")]
        pairs = {"pairs", "beir"} >= set(kinds.values())
        if other or (len(set(kinds.values())) > 1 and not pairs):
            raise UsageError(f"--method simcse-sup trains on NLI files or on (anchor, positive, negative) triplets "
                             f"(python -m bertcf.data mine-negatives), of one kind, or on (query, positive) pairs (a "
                             f"query<TAB>positive file, a set in BEIR's layout): {', '.join(other) or 'mixed'}")
        where = ", ".join(map(str, files))
        if pairs:
            read = [beir_pairs(f, "train")[:2] if kinds[f] == "beir" else read_query_pairs(f) for f in files]
            queries, positives = [q for r in read for q in r[0]], [p for r in read for p in r[1]]
            return Examples([queries, positives], None, (), f"{len(queries):,} (query, positive) pairs from {where}")
        if "triplets" in kinds.values():
            triples = [t for f in files for t in read_triplets(f)]
            return Examples([list(c) for c in zip(*triples)], None, (),
                            f"{len(triples):,} (anchor, positive, mined negative) triplets from {where}")
        examples = [e for f in files for e in read_nli(f)]
        triples = nli_triples(examples)
        if not triples:
            raise DataError(f"{where}: no premise has both an entailed and a contradicted "
                            f"hypothesis, so there are no triples for supervised SimCSE")
        anchors, positives, negatives = (list(column) for column in zip(*triples))
        return Examples([anchors, positives, negatives], None, (), f"{len(triples):,} (premise, entailment, "
                                                                   f"contradiction) triples from {where}")

    @classmethod
    def from_examples(cls, examples: Examples) -> dict:
        return {"hard_negatives": len(examples.columns) == 3}

    def checkpoint_modules(self):
        return {"encoder": self.encoder} | ({"mlp": self.mlp} if self.mlp is not None else {})

    def views(self, ids, mask, rank: int, world: int) -> list[torch.Tensor]:
        """h, h+ (and h-) [b, D] of this rank's rows (after the MLP with cls-mlp)."""
        h = torch.cat(self.column_embeddings(ids, mask, self.columns, rank, world))
        return list((self.mlp(h) if self.mlp is not None else h).chunk(self.columns))

    def loss(self, ids, mask, special, rank=0, world=1, labels=None):
        views = self.views(ids, mask, rank, world)
        loss = self.at_widths(lambda v, _: self.info_nce(*v), views)
        with torch.no_grad():
            scalars = pair_scalars(views[0], views[1])
            if len(views) == 3:
                scalars["hard_negative_cosine"] = torch.nn.functional.cosine_similarity(
                    views[0].float(), views[2].float()).mean()
        return loss, scalars
