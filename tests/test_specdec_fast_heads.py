"""Beyond (specdec-lineage): every draft head on module 16's fused step, through the engine.

``fast_model(head)`` gives a head whose block runs on ``g2c.kvcache.step.block_rows`` (the fused
block of the fast path); the heads call it at their block-step sites (EAGLE's and MTP's cached
drafter, the lineage drafters' ``masked_block``). Oracle: the same run with the teaching head. A
fused head's logits are within 1e-5 of the teaching head's (tests/test_kvcache_step.py), and the
tiny models here have peaked logits (argmax gaps far above 1e-5), so the drafts, and with them the
emitted ids and every counter, must be the same; greedy output must also be plain greedy decoding
(lossless). A bfloat16 head over a float32 target only proposes: the output stays the target's.
"""

from __future__ import annotations

import pytest
import torch
from test_specdec_cached import _lm

from g2c.kvcache import cached_generate, fast_model
from g2c.kvcache.step import BlockStep, block_step
from g2c.specdec import MTPHead
from g2c.specdec.lineage import (
    BlockDrafter,
    BlockHead,
    Eagle3Drafter,
    Eagle3Head,
    EagleTreeDrafter,
    MedusaDrafter,
    MedusaHeads,
    lineage_generate,
)
from g2c.specdec.sampling.eagle import EagleDrafter, FeatureDrafter, MTPDrafter
from g2c.specdec.sampling.loop import speculative_sample

PROMPT = [3, 9, 1, 7, 2]
NEW = 14
HEADS = ["mtp", "eagle", "eagle-chain", "eagle2", "eagle-static", "eagle3", "medusa", "block"]


def _target():
    return _lm(2, layers=4, max_seq_len=48)


def _head(kind: str, target):
    g = torch.Generator().manual_seed(0)
    if kind == "mtp":
        return MTPHead(target, generator=g).eval()
    if kind in ("eagle", "eagle-chain", "eagle2", "eagle-static"):
        return FeatureDrafter(target, generator=g).eval()
    if kind == "eagle3":
        return Eagle3Head(target, generator=g).eval()
    if kind == "medusa":
        heads = MedusaHeads(target, 3)
        with torch.no_grad():
            heads.weight.normal_(0, 0.3, generator=g)
        return heads.eval()
    return BlockHead(target, block_size=4, generator=g).eval()


def _run(kind: str, target, head):
    if kind in ("mtp", "eagle"):
        drafter = MTPDrafter(head) if kind == "mtp" else EagleDrafter(head)
        ids, stats = speculative_sample(target, drafter, PROMPT, NEW, k=1 if kind == "mtp" else 3, temperature=0.0,
                                        use_cache=True)
    else:
        drafter = {"eagle-chain": lambda: EagleTreeDrafter(head), "eagle2": lambda: EagleTreeDrafter(head, width=2),
                   "eagle-static": lambda: EagleTreeDrafter(head, shape="static"),
                   "eagle3": lambda: Eagle3Drafter(head, width=2), "medusa": lambda: MedusaDrafter(head),
                   "block": lambda: BlockDrafter(head)}[kind]()
        ids, stats = lineage_generate(target, drafter, PROMPT, NEW, num_nodes=5, temperature=0.0)
    return ids.tolist(), (stats.target_passes, stats.drafted, stats.accepted), drafter


def _block_state(drafter):
    """What the head's block wrote: its cache's committed keys and values (None: it keeps no cache)."""
    cache = getattr(drafter, "cache", None)
    if cache is None:
        return None
    return cache.keys_buffer[0][:, :, :cache.length], cache.values_buffer[0][:, :, :cache.length]


@pytest.mark.parametrize("kind", HEADS)
def test_a_fast_head_on_the_fused_step_drafts_what_the_teaching_head_drafts(kind):
    target = _target()
    head = _head(kind, target)
    fast_head = fast_model(head)
    *want, slow = _run(kind, target, head)
    *got, quick = _run(kind, fast_model(target), fast_head)
    assert got == want
    assert want[0] == cached_generate(target, torch.tensor(PROMPT), NEW, temperature=0.0).tolist()   # lossless
    assert want[1][1] > 0                                                          # it drafted
    # the argmax hides small errors: compare what the blocks computed, within the fp32 bound
    if _block_state(slow) is not None:
        for a, b in zip(_block_state(quick), _block_state(slow)):
            assert a.shape == b.shape and a.shape[2] > 0
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    if kind == "block":
        states = torch.randn(1, 6, 4, target.embedding_dim, generator=torch.Generator().manual_seed(1))
        anchor = torch.tensor([5])
        torch.testing.assert_close(fast_head(states, anchor, 4), head(states, anchor, 4), rtol=1e-5, atol=1e-5)
    blocks = [m for _, m in fast_head.named_modules() if hasattr(m, "attn") and hasattr(m, "mlp")]
    if kind != "medusa":                                                           # Medusa's heads have no block
        assert blocks and all(isinstance(block_step(b), BlockStep) for b in blocks)


@pytest.mark.parametrize("kind", ["eagle", "eagle2", "block"])
def test_a_bfloat16_fast_head_over_a_float32_target_stays_lossless(kind):
    target = _target()
    head = fast_model(_head(kind, target), dtype="bf16")
    ids, counts, _ = _run(kind, fast_model(target), head)
    assert ids == cached_generate(target, torch.tensor(PROMPT), NEW, temperature=0.0).tolist()
    assert counts[1] > 0


def test_a_head_built_with_the_plain_backend_runs_the_teaching_block_on_fast_leaves():
    target = _target()
    head = fast_model(_head("eagle-chain", target), backend="plain")
    assert block_step(head.block) is None
    assert _run("eagle-chain", target, head)[:2] == _run("eagle-chain", target, _head("eagle-chain", target))[:2]
