"""Module 09b: the pretraining objective — random windows of a token stream, the LM loss, splits.

Oracles: windows located by hand in an ``arange``-like stream, the same batch from a tensor
and from a ``uint16`` memmap, then ``torch.nn.functional.cross_entropy``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from g2c.pretraining import get_lm_batch, lm_cross_entropy, split_stream


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- get_lm_batch --------------------------------------------------------------------------

@pytest.mark.parametrize("ids, batch_size, context, match", [
    (torch.arange(8), 2, 8, "too short"),          # needs context + 1 = 9 ids
    (torch.arange(8), 0, 4, "must be >= 1"),
    (torch.arange(8), 2, 0, "must be >= 1"),
    (torch.arange(16).view(4, 4), 2, 2, "1-D"),
])
def test_get_lm_batch_rejects_short_stream(ids, batch_size, context, match):
    with pytest.raises(ValueError, match=match):
        get_lm_batch(ids, batch_size, context, generator=_gen())


def test_get_lm_batch_covers_the_end():
    # N = T + 2 ids allow exactly two windows: starts 0 and 1. With 200 independent draws the
    # chance of never drawing one of them is 2 * 2**-200; the generator is fixed anyway.
    T = 5
    ids = torch.arange(T + 2)
    x, y = get_lm_batch(ids, 200, T, generator=_gen())
    assert set(x[:, 0].tolist()) == {0, 1}
    assert int(y.max()) == T + 1                  # the last id of the stream is a target
    assert int(x.min()) == 0                      # the first id is an input


def test_get_lm_batch_targets_are_shifted():
    g = _gen(1)
    ids = torch.randperm(500, generator=g)        # distinct values: a window is found by its first id
    B, T = 6, 7
    x, y = get_lm_batch(ids, B, T, generator=_gen(2))
    assert x.shape == y.shape == (B, T)
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:])
    for row_x, row_y in zip(x, y):
        s = int((ids == row_x[0]).nonzero())
        assert torch.equal(row_x, ids[s:s + T])
        assert torch.equal(row_y, ids[s + 1:s + T + 1])


def test_get_lm_batch_is_reproducible_with_a_seeded_generator():
    ids = torch.arange(1000)
    a = get_lm_batch(ids, 4, 16, generator=_gen(7))
    b = get_lm_batch(ids, 4, 16, generator=_gen(7))
    c = get_lm_batch(ids, 4, 16, generator=_gen(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_get_lm_batch_reads_a_uint16_memmap(tmp_path):
    # Token ids above 32767 must survive as positive int64 (a uint16 read as int16 would not).
    values = (np.arange(300, dtype=np.int64) * 211 + 40000) % 65536
    path = tmp_path / "train.bin"
    mm = np.memmap(path, dtype=np.uint16, mode="w+", shape=(300,))
    mm[:] = values
    mm.flush()
    stream = np.memmap(path, dtype=np.uint16, mode="r")
    x_np, y_np = get_lm_batch(stream, 5, 9, generator=_gen(3))
    x_t, y_t = get_lm_batch(torch.from_numpy(values), 5, 9, generator=_gen(3))
    assert x_np.dtype == torch.int64 and x_np.device.type == "cpu"
    assert torch.equal(x_np, x_t) and torch.equal(y_np, y_t)
    assert int(x_np.min()) >= 0


# -- lm_cross_entropy ----------------------------------------------------------------------

@pytest.mark.parametrize("logit_shape, target_shape", [
    ((2, 3, 5), (2, 4)),
    ((2, 3, 5), (3, 2)),
    ((6, 5), (6,)),
])
def test_lm_cross_entropy_rejects_mismatched_shapes(logit_shape, target_shape):
    with pytest.raises(ValueError, match=r"logits \(B, T, V\) and targets \(B, T\)"):
        lm_cross_entropy(torch.zeros(logit_shape), torch.zeros(target_shape, dtype=torch.long))


def test_lm_cross_entropy_matches_torch():
    g = _gen(4)
    logits = torch.randn(3, 5, 11, generator=g)
    targets = torch.randint(0, 11, (3, 5), generator=g)
    expected = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1))
    got = lm_cross_entropy(logits, targets)
    assert got.dim() == 0
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_lm_cross_entropy_uniform_logits_give_log_v():
    # Equal logits are a uniform guess over V = 7 tokens: loss ln 7 whatever the targets.
    loss = lm_cross_entropy(torch.zeros(2, 3, 7), torch.tensor([[0, 1, 2], [3, 4, 6]]))
    assert float(loss) == pytest.approx(float(np.log(7)), abs=1e-6)


# -- split_stream (provided) ---------------------------------------------------------------

def test_split_stream_keeps_order_and_sizes():
    ids = torch.arange(100)
    train, val = split_stream(ids, val_fraction=0.1)
    assert len(train) == 90 and len(val) == 10
    assert torch.equal(torch.cat([train, val]), ids)


@pytest.mark.parametrize("n, fraction, match", [
    (100, 0.0, r"in \(0, 1\)"),
    (100, 1.0, r"in \(0, 1\)"),
    (10, 0.05, "too short"),
])
def test_split_stream_rejects_bad_arguments(n, fraction, match):
    with pytest.raises(ValueError, match=match):
        split_stream(torch.arange(n), val_fraction=fraction)
