"""Module 10: the trainer loop, validation, checkpoints and ``stream_loss``.

Oracles: the learning rates from ``cosine_with_warmup`` by hand, spies on the optimizer and
on gradient clipping for the step order, a hand-written training step, an uninterrupted run
for resuming, and a bigram table model whose stream loss is computed with torch.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from device_mocks import FAKE_DEVICE, fake_device_active

import g2c.pretraining.trainer as trainer_mod
from g2c.nn import Module
from g2c.pretraining import TrainConfig, Trainer, get_lm_batch, lm_cross_entropy, stream_loss
from g2c.training import AdamW, clip_grad_norm_, cosine_with_warmup
from g2c.transformer import TransformerLM

V = 16


@pytest.fixture(autouse=True)
def _trainer_on_the_fake_device(monkeypatch):
    """Under ``pytest --fake-device`` every parameter lives on the fake accelerator whatever ``.to("cpu")``
    does, so the configs' ``device="cpu"`` stands for that accelerator (as ``device="mps"`` would on a Mac):
    the trainer resolves it there, so its batches must join the parameters, and autocasts as the CPU does,
    where the fake device's data sit. A plain run is untouched."""
    if not fake_device_active():
        return
    monkeypatch.setattr(trainer_mod, "resolve_device", lambda device: FAKE_DEVICE)
    real_autocast = torch.autocast
    monkeypatch.setattr(torch, "autocast", lambda device_type, **kw: real_autocast(
        "cpu" if device_type == FAKE_DEVICE.type else device_type, **kw))


def _model(seed: int = 0, *, dropout: float = 0.0, max_seq_len: int = 8) -> TransformerLM:
    return TransformerLM(V, 16, 1, 2, max_seq_len, dropout=dropout, generator=torch.Generator().manual_seed(seed))


def _stream(n: int = 400, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


def _config(**kw) -> TrainConfig:
    base = dict(batch_size=4, context=8, max_steps=6, warmup_steps=2, max_lr=1e-2, min_lr=1e-3,
                weight_decay=0.1, grad_clip=1.0, eval_every=0, eval_batches=2, seed=0, device="cpu")
    base.update(kw)
    return TrainConfig(**base)


def _global_norm(params) -> float:
    return math.sqrt(sum(float((p.grad.float() ** 2).sum()) for p in params if p.grad is not None))


class BigramTable(Module):
    """logits[b, t] = table[ids[b, t]]: a model whose loss torch can compute directly."""

    def __init__(self, table: torch.Tensor, max_seq_len: int = 8) -> None:
        super().__init__()
        self.table = table.clone().requires_grad_(True)
        self.max_seq_len = max_seq_len

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids]                                               # (B, T, V)


# -- train_step ----------------------------------------------------------------------------

def test_trainer_uses_schedule():
    cfg = _config(max_steps=5, warmup_steps=2)
    tr = Trainer(_model(), _stream(), config=cfg)
    seen = []                                     # lr on the optimizer when the update is applied
    real_step = tr.optimizer.step

    def step_spy():
        seen.append(tr.optimizer.lr)
        real_step()

    tr.optimizer.step = step_spy
    for _ in range(5):
        tr.train_step()
    expected = [cosine_with_warmup(i, warmup_steps=2, max_steps=5, max_lr=1e-2, min_lr=1e-3) for i in range(5)]
    assert seen == pytest.approx(expected, rel=0, abs=1e-12)
    assert [r["lr"] for r in tr.history] == pytest.approx(expected, rel=0, abs=1e-12)


def test_trainer_step_order(monkeypatch):
    cfg = _config(grad_clip=1e-3)                 # tiny threshold: clipping must act on this step
    tr = Trainer(_model(), _stream(), config=cfg)
    params = tr.model.parameters()
    for p in params:                              # stale gradients that zero_grad must clear
        p.grad = torch.full_like(p, 1e3)
    events: list[str] = []
    real_forward, real_zero, real_step = tr.model.forward, tr.optimizer.zero_grad, tr.optimizer.step
    clip_inputs: list[float] = []
    step_inputs: list[float] = []

    def forward_spy(ids):
        events.append("forward")
        return real_forward(ids)

    def zero_spy():
        events.append("zero_grad")
        real_zero()

    def clip_spy(ps, max_norm, **kw):
        ps = list(ps)
        events.append("clip")
        assert all(p.grad is not None for p in ps), "backward must run between zero_grad and clipping"
        clip_inputs.append(_global_norm(ps))
        return clip_grad_norm_(ps, max_norm, **kw)

    def step_spy():
        events.append("step")
        step_inputs.append(_global_norm(params))
        real_step()

    tr.model.forward = forward_spy
    tr.optimizer.zero_grad = zero_spy
    tr.optimizer.step = step_spy
    monkeypatch.setattr(trainer_mod, "clip_grad_norm_", clip_spy)
    rec = tr.train_step()

    assert [e for e in events if e != "forward"] == ["zero_grad", "clip", "step"]
    assert events.index("forward") < events.index("clip")
    # Fresh gradients of a 16-wide model are O(1); the stale ones had norm >= 1e3.
    assert clip_inputs[0] < 1e2
    assert rec["grad_norm"] == pytest.approx(clip_inputs[0], rel=1e-5)
    assert rec["grad_norm"] > cfg.grad_clip
    assert step_inputs[0] <= cfg.grad_clip * (1 + 1e-4)   # the optimizer saw clipped gradients
    assert tr.step == 1 and rec["step"] == 1
    assert rec["tokens"] == cfg.batch_size * cfg.context


def test_trainer_step_matches_a_hand_written_step():
    cfg = _config(max_steps=4)
    ids = _stream()
    tr = Trainer(_model(3), ids, config=cfg)
    ref = _model(3)
    no_decay = [p for name, p in ref.named_parameters() if p.dim() < 2 or "pos_embed" in name]
    opt = AdamW(ref.parameters(), lr=cfg.max_lr, betas=cfg.betas, weight_decay=cfg.weight_decay, no_decay=no_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    for i in range(2):
        x, y = (t.to(ref.device) for t in get_lm_batch(ids, cfg.batch_size, cfg.context, generator=gen))
        opt.lr = cosine_with_warmup(i, warmup_steps=cfg.warmup_steps, max_steps=cfg.max_steps,
                                    max_lr=cfg.max_lr, min_lr=cfg.min_lr)
        loss = lm_cross_entropy(ref(x), y)
        opt.zero_grad()
        loss.backward()
        clip_grad_norm_(ref.parameters(), cfg.grad_clip)
        opt.step()
        rec = tr.train_step()
        assert rec["loss"] == pytest.approx(float(loss.detach()), rel=1e-6)
    for (name, a), (_, b) in zip(tr.model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)


def test_trainer_loss_falls_on_a_memorisation_task():
    # A stream that cycles through a fixed permutation of the 16 tokens: each token fixes the
    # next, so a model that memorises the cycle drives the loss from ln 16 = 2.77 towards 0
    # (the reference reaches ~0.3 after 30 steps and ~0.015 after 60: a wide margin).
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(5))
    ids = perm.repeat(25)
    cfg = _config(max_steps=60, warmup_steps=5, max_lr=2e-2, min_lr=2e-3, weight_decay=0.0, batch_size=8)
    tr = Trainer(_model(1), ids, config=cfg)
    hist = tr.fit(progress=False)
    assert len(hist) == 60
    assert hist[0]["loss"] > 2.0
    assert hist[-1]["loss"] < 0.2


def test_trainer_bf16_step_runs():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr = Trainer(_model(), _stream(), config=_config(bf16=True))
    rec = tr.train_step()
    assert math.isfinite(rec["loss"]) and rec["loss"] > 0
    # a CPU without bfloat16 kernels (AVX2 only) emulates autocast ~50x slower: the Trainer says so, once
    slow = [w for w in caught if "without bfloat16 products" in str(w.message)]
    emulated = tr.device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported()   # (--fake-device: not cpu)
    assert len(slow) == int(emulated), [str(w.message) for w in caught]


# -- evaluate / fit ------------------------------------------------------------------------

def test_trainer_evaluate_is_deterministic_and_keeps_mode():
    tr = Trainer(_model(dropout=0.2), _stream(), _stream(200, seed=1), config=_config())
    a = tr.evaluate()
    b = tr.evaluate()
    assert a == b                                 # same fixed batches, dropout off
    assert tr.model.training


def test_trainer_fit_records_validation_and_best_weights(tmp_path):
    ckpt = tmp_path / "run" / "trainer.pt"
    tr = Trainer(_model(), _stream(), _stream(200, seed=1), config=_config(max_steps=5, eval_every=2))
    hist = tr.fit(progress=False, checkpoint_path=ckpt)
    assert [r["step"] for r in hist if "val_loss" in r] == [2, 4, 5]   # every 2 steps and the last
    assert tr.best_val_loss == min(r["val_loss"] for r in hist if "val_loss" in r)
    assert tr.best_state is not None and set(tr.best_state) == {n for n, _ in tr.model.named_parameters()}
    assert ckpt.is_file()


# -- checkpoints ---------------------------------------------------------------------------

def test_trainer_resume_is_bit_identical(tmp_path):
    # Dropout is on, so resuming also has to restore the global RNG, not only the batch sampler.
    cfg = _config(max_steps=6, eval_every=3)
    train, val = _stream(), _stream(200, seed=1)
    full = Trainer(_model(0, dropout=0.1), train, val, config=cfg)
    full.fit(progress=False)

    first = Trainer(_model(0, dropout=0.1), train, val, config=cfg)
    first.fit(3, progress=False)
    first.save_checkpoint(tmp_path / "ckpt.pt")
    torch.manual_seed(1234)                       # disturb the global RNG before resuming
    resumed = Trainer(_model(99, dropout=0.1), train, val, config=cfg)   # other initial weights
    resumed.load_checkpoint(tmp_path / "ckpt.pt")
    assert resumed.step == 3
    resumed.fit(progress=False)

    assert resumed.history == full.history
    for (name, a), (_, b) in zip(resumed.model.named_parameters(), full.model.named_parameters()):
        assert torch.equal(a, b), name
    for sa, sb in zip(resumed.optimizer.state, full.optimizer.state):
        assert sa["step"] == sb["step"] and torch.equal(sa["m"], sb["m"]) and torch.equal(sa["v"], sb["v"])
    assert resumed.best_val_loss == full.best_val_loss


def test_trainer_load_checkpoint_rejects_another_config(tmp_path):
    tr = Trainer(_model(), _stream(), config=_config())
    tr.save_checkpoint(tmp_path / "a.pt")
    other = Trainer(_model(), _stream(), config=_config(max_lr=5e-3))
    with pytest.raises(ValueError, match="another TrainConfig.*max_lr"):
        other.load_checkpoint(tmp_path / "a.pt")


def test_trainer_load_checkpoint_rejects_missing_file(tmp_path):
    tr = Trainer(_model(), _stream(), config=_config())
    with pytest.raises(FileNotFoundError, match="no trainer checkpoint"):
        tr.load_checkpoint(tmp_path / "nope.pt")


@pytest.mark.parametrize("damage", ["flip", "truncate", "no_record"])
def test_trainer_load_checkpoint_refuses_a_damaged_file(tmp_path, damage):
    """Family 6: a bit-flipped or truncated trainer.pt (or one without its recorded sha256) is
    refused with the fix; it never resumes with a corrupted optimizer state."""
    tr = Trainer(_model(), _stream(), config=_config())
    ckpt = tmp_path / "trainer.pt"
    tr.save_checkpoint(ckpt)
    raw = bytearray(ckpt.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x01
        ckpt.write_bytes(bytes(raw))
        match = r"trainer\.pt does not match its recorded sha256/size .*delete .*trainer\.pt"
    elif damage == "truncate":
        ckpt.write_bytes(bytes(raw[:-100]))
        match = r"trainer\.pt does not match its recorded sha256/size .*truncated or corrupted"
    else:
        (tmp_path / "trainer.pt.sha256").unlink()
        match = r"trainer\.pt has no recorded checksum \(trainer\.pt\.sha256 is missing\)"
    other = Trainer(_model(5), _stream(), config=_config())
    before = {k: v.clone() for k, v in other.model.state_dict().items()}
    with pytest.raises(ValueError, match=match):
        other.load_checkpoint(ckpt)
    assert other.step == 0 and all(torch.equal(v, before[k]) for k, v in other.model.state_dict().items())


# -- constructor and evaluate errors -------------------------------------------------------

def test_trainer_rejects_context_beyond_the_window():
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len=8"):
        Trainer(_model(max_seq_len=8), _stream(), config=_config(context=9))


@pytest.mark.parametrize("train_n, val_n, match", [(8, None, "train_ids has 8 tokens"),
                                                    (400, 5, "val_ids has 5 tokens")])
def test_trainer_rejects_short_streams(train_n, val_n, match):
    val = None if val_n is None else _stream(val_n)
    with pytest.raises(ValueError, match=match):
        Trainer(_model(), _stream(train_n), val, config=_config())


def test_trainer_evaluate_without_validation_stream_raises():
    tr = Trainer(_model(), _stream(), config=_config())
    with pytest.raises(ValueError, match="needs val_ids"):
        tr.evaluate()


# -- stream_loss (provided) ----------------------------------------------------------------

def test_stream_loss_matches_torch_on_non_overlapping_windows():
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(2))
    model = BigramTable(table)
    ids = _stream(43)                             # (43 - 1) // 8 = 5 windows; the 2-token tail is dropped
    got = stream_loss(model, ids, context=8, batch_size=2)
    inputs, targets = ids[:40], ids[1:41]
    expected = F.cross_entropy(table[inputs], targets)
    assert got == pytest.approx(float(expected), rel=1e-5)
    assert stream_loss(model, ids, context=8, batch_size=3) == pytest.approx(got, rel=1e-6)
    assert model.training                         # mode restored


def test_stream_loss_is_deterministic_on_a_memmap(tmp_path):
    import numpy as np
    ids = _stream(100).numpy().astype(np.uint16)
    path = tmp_path / "val.bin"
    ids.tofile(path)
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    model = BigramTable(torch.randn(V, V, generator=torch.Generator().manual_seed(3)))
    a = stream_loss(model, mm, context=8)
    assert a == stream_loss(model, mm, context=8)
    assert a == pytest.approx(stream_loss(model, torch.from_numpy(ids.astype(np.int64)), context=8), rel=1e-6)


def test_stream_loss_rejects_a_short_stream():
    with pytest.raises(ValueError, match="shorter than context"):
        stream_loss(BigramTable(torch.zeros(V, V)), _stream(8), context=8)


def test_stream_loss_restores_the_mode_when_the_model_raises():
    class Crash(Exception):
        pass

    class Crashing(Module):
        device = torch.device("cpu")

        def forward(self, ids):
            raise Crash("mid-evaluation")

    model = Crashing()
    assert model.training
    with pytest.raises(Crash):
        stream_loss(model, torch.arange(20), context=4, batch_size=2)
    assert model.training                                                   # restored in finally
