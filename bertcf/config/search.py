"""A search index's settings (``IndexConfig``): its kind, its HNSW graph, and the rescoring of the
quantised kinds; ``python -m bertcf.search build`` takes them, and ``python -m bertcf.evaluate``
(``EvaluateConfig``) for retrieval through an index (``--index``)."""
from __future__ import annotations

from dataclasses import dataclass

from .. import cli
from ..search.index import EF_CONSTRUCTION, EF_SEARCH, HNSW_M, KINDS, RESCORE_MULTIPLIER
from ..settings import Settings, option


@dataclass(frozen=True)
class IndexConfig(Settings):
    GROUP = "search index"

    index: str = option("hnsw", "exact: every float32 vector scored; hnsw: float32 vectors in an HNSW graph; int8: "
                                "int8 codes in an HNSW graph; binary: one bit a dimension, by Hamming distance "
                                "(faiss: pip install 'bertcf[search]')", choices=KINDS)
    hnsw_m: int = option(HNSW_M, "hnsw, int8: the graph's links per vector (HNSW's M)", type=cli.AT_LEAST_2)
    ef_construction: int = option(EF_CONSTRUCTION, "hnsw, int8: candidates considered when a vector is added",
                                  type=cli.AT_LEAST_1)
    ef_search: int = option(EF_SEARCH, "hnsw, int8: candidates considered by a search (at least k are)",
                            type=cli.AT_LEAST_1)
    rescore_multiplier: int = option(RESCORE_MULTIPLIER, "int8, binary: the codes find this many times k "
                                                         "candidates, which the float query scores again "
                                                         "(sentence-transformers' rescoring)", type=cli.AT_LEAST_1)
    no_rescore: bool = option(False, "int8, binary: rank by the codes alone (int8 inner products, Hamming "
                                     "distances)", switch=True)

    def graph(self) -> dict:
        """The HNSW settings, as ``bertcf.search`` takes them."""
        return {"hnsw_m": self.hnsw_m, "ef_construction": self.ef_construction, "ef_search": self.ef_search}

    def multiplier(self) -> int:
        """The rescoring's multiplier, 0 for none."""
        return 0 if self.no_rescore else self.rescore_multiplier
