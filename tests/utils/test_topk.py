"""Exact top-k search in chunks (bertcf.utils.topk), which retrieval, mining and the search
benchmark share: any chunking gives the whole search's answer, a short corpus pads, and ties at
the cut go to the lower position across chunks."""
from __future__ import annotations

import torch

from bertcf.utils.topk import TopK, nearest


def test_chunked_search_is_the_whole_search():
    g = torch.Generator().manual_seed(1)
    q, c = torch.randn(13, 8, generator=g), torch.randn(29, 8, generator=g)
    whole = torch.topk(q @ c.T, 6, dim=1)
    for chunk in (1, 4, 13, 100):
        scores, indices = nearest(q, c, 6, chunk)
        assert torch.equal(indices, whole.indices) and torch.allclose(scores, whole.values)
    scores, indices = nearest(q, c[:3], 5, 2)  # fewer candidates than asked: padded
    assert (indices[:, 3:] == -1).all() and torch.isinf(scores[:, 3:]).all()


def test_top_k_breaks_ties_at_the_cut_toward_lower_positions():
    top = TopK(3, 2)
    top.update(0, torch.tensor([[0.5, 0.9, 0.5, 0.9], [0.9, 0.5, 0.5, 0.5], [0.1, 0.2, 0.2, 0.2]]), 0)
    top.update(0, torch.tensor([[0.9, 0.1], [0.5, 0.9], [0.2, 0.3]]), 4)  # a second chunk ties with the first
    assert top.indices.tolist() == [[1, 3], [0, 5], [5, 1]]


def test_ties_go_to_the_lower_position_whatever_the_chunk():
    """Equal scores across and within chunks: every chunking ranks them by position."""
    q = torch.ones(2, 1)
    c = torch.tensor([[1.0], [2.0], [1.0], [2.0], [1.0], [2.0], [1.0]])
    for chunk in (1, 2, 3, 7):
        scores, indices = nearest(q, c, 4, chunk)
        assert indices.tolist() == [[1, 3, 5, 0]] * 2 and scores[0].tolist() == [2.0, 2.0, 2.0, 1.0]
