"""Module 10: the trainer loop, validation, and resumable checkpoints.

One optimizer step, in the order that matters:
sample a batch -> set the learning rate -> forward + loss -> clear old gradients ->
backward -> clip the global gradient norm -> AdamW step -> advance the step counter.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import time
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from g2c.nn import Module, eval_mode, resolve_device
from g2c.nn.module import check_int, check_real
from g2c.training import AdamW, clip_grad_norm_, cosine_with_warmup

from .objective import check_stream, get_lm_batch, lm_cross_entropy

__all__ = ["TrainConfig", "Trainer", "load_checked", "no_decay_params", "save_checked", "stream_loss"]


def no_decay_params(model: Module) -> list[torch.Tensor]:
    """The parameters that get no weight decay: biases, LayerNorm gains (every tensor with
    fewer than 2 dims) and the learned position table. Provided; the one place this rule lives.

    Source: GPT-2/nanoGPT practice; AdamW's decoupled decay (Loshchilov and Hutter 2019).
    """
    return [p for name, p in model.named_parameters() if p.dim() < 2 or "pos_embed" in name]


@dataclass
class TrainConfig:
    """Hyper-parameters of one training run (all keyword, all recorded in checkpoints).

    Attributes:
        batch_size: sequences per step (B).
        context: tokens per sequence (T), <= the model's ``max_seq_len``.
        max_steps: length of the cosine schedule (and of ``fit()`` by default).
        warmup_steps: linear warmup length.
        max_lr, min_lr: schedule peak and floor.
        weight_decay: AdamW λ on matrices (biases, LayerNorm gains and position tables get none).
        betas: AdamW (β1, β2).
        grad_clip: max global gradient norm.
        eval_every: run validation every this many steps (0 = never during ``fit``).
        eval_batches: validation batches per evaluation (the same batches every time).
        seed: seeds the batch sampler, the dropout RNG and the validation batches.
        bf16: run the forward pass under bfloat16 autocast.
        device: "auto", "cpu", "cuda", "mps" (checked by ``resolve_device`` when a ``Trainer`` starts).

    Raises:
        TypeError: a field of the wrong type (a bool or a float where a count goes, a string where a
            rate goes, ``bf16`` not a bool, ``device`` not a string); the message names the field.
        ValueError: a field out of range (a count < 1, ``warmup_steps`` outside [0, max_steps],
            ``max_lr`` <= 0, ``min_lr`` outside [0, max_lr], a beta outside [0, 1), ``grad_clip`` <= 0,
            NaN or infinity anywhere); the message names the field, the rule and the value.
    """

    batch_size: int = 16
    context: int = 128
    max_steps: int = 1000
    warmup_steps: int = 100
    max_lr: float = 1e-3
    min_lr: float = 1e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    seed: int = 0
    bf16: bool = False
    device: str = "cpu"

    def __post_init__(self) -> None:
        # Provided: every field is checked (and normalised to a Python int/float) where it enters, so a bad
        # value stops here with its name instead of deep inside a training step (or not at all).
        w = "TrainConfig"
        self.batch_size = check_int(self.batch_size, "batch_size", where=w)
        self.context = check_int(self.context, "context", where=w)
        self.max_steps = check_int(self.max_steps, "max_steps", where=w)
        self.warmup_steps = check_int(self.warmup_steps, "warmup_steps", minimum=0, maximum=self.max_steps, where=w)
        self.max_lr = check_real(self.max_lr, "max_lr", low=0.0, low_open=True, where=w)
        self.min_lr = check_real(self.min_lr, "min_lr", low=0.0, high=self.max_lr, where=w)
        self.weight_decay = check_real(self.weight_decay, "weight_decay", low=0.0, where=w)
        if isinstance(self.betas, (str, bytes)) or not hasattr(self.betas, "__len__") or len(self.betas) != 2:
            raise TypeError(f"{w}: betas must be a pair (beta1, beta2) of reals in [0, 1), got "
                            f"{type(self.betas).__name__} {self.betas!r:.60}")
        self.betas = tuple(check_real(b, f"betas[{i}]", low=0.0, high=1.0, high_open=True, where=w)
                           for i, b in enumerate(self.betas))
        self.grad_clip = check_real(self.grad_clip, "grad_clip", low=0.0, low_open=True, where=w)
        self.eval_every = check_int(self.eval_every, "eval_every", minimum=0, where=w)
        self.eval_batches = check_int(self.eval_batches, "eval_batches", where=w)
        self.seed = check_int(self.seed, "seed", minimum=0, where=w)
        if not isinstance(self.bf16, bool):
            raise TypeError(f"{w}: bf16 must be True or False, got {type(self.bf16).__name__} {self.bf16!r:.60}")
        if not isinstance(self.device, str):
            raise TypeError(f"{w}: device must be a string ('auto', 'cpu', 'cuda', 'cuda:N', 'mps'), "
                            f"got {type(self.device).__name__} {self.device!r:.60}")


class Trainer:
    """Trains a ``TransformerLM``-like model (ids (B, T) -> logits (B, T, V)) on a token stream.

    Args:
        model: a course ``Module``; moved to ``config.device``.
        train_ids: 1-D token stream (tensor or ``uint16`` memmap).
        val_ids: optional 1-D validation stream.
        config: a ``TrainConfig``.

    Attributes:
        step: optimizer steps taken so far.
        history: list of dicts, one per step: ``step, loss, lr, grad_norm, tokens`` and,
            on evaluation steps, ``val_loss``.
        best_val_loss / best_state: the lowest validation loss seen by ``fit`` and a copy
            of the weights at that point.

    Raises:
        TypeError: ``model`` is not a model (no ``parameters``/``to``, not callable), ``config`` is not a
            ``TrainConfig``, a stream is not a tensor or NumPy array of integer ids.
        ValueError: context larger than the model's window, streams too short, or a stream holding an
            id outside the model's vocabulary [0, vocab_size) (one pass over each stream, here, instead
            of an IndexError at some later step).

    Warns:
        RuntimeWarning: ``config.bf16`` on a CPU whose oneDNN has no bfloat16 kernels (an AVX2 CPU
            without AVX-512 BF16, or an ARM CPU without BF16): autocast still works but is emulated,
            about 50x slower than float32 for a matrix product (docs/performance.md, "Which CPU").
    """

    def __init__(self, model: Module, train_ids, val_ids=None, config: TrainConfig | None = None) -> None:
        if config is not None and not isinstance(config, TrainConfig):
            raise TypeError(f"Trainer: config must be a TrainConfig or None, got {type(config).__name__} "
                            f"{config!r:.60}")
        if not (callable(model) and callable(getattr(model, "parameters", None))
                and callable(getattr(model, "to", None))):
            raise TypeError(f"Trainer: model must be a course Module (ids (B, T) -> logits (B, T, V)), "
                            f"got {type(model).__name__} {' '.join(repr(model).split())[:60]}")
        check_stream(train_ids, "Trainer (train_ids)")
        if val_ids is not None:
            check_stream(val_ids, "Trainer (val_ids)")
        self.config = config or TrainConfig()
        c = self.config
        max_len = getattr(model, "max_seq_len", c.context)
        if c.context > max_len:
            raise ValueError(f"TrainConfig.context={c.context} exceeds the model's max_seq_len={max_len}")
        for name, ids in (("train_ids", train_ids), ("val_ids", val_ids)):
            if ids is not None and len(ids) < c.context + 1:
                raise ValueError(f"{name} has {len(ids)} tokens, fewer than context + 1 = {c.context + 1}")
            vocab = getattr(model, "vocab_size", None)
            if ids is not None and isinstance(vocab, int) and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
                bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
                raise ValueError(f"{name} holds token id {bad}, outside the model's vocabulary [0, {vocab}): "
                                 "the stream and the model come from different tokenizers")
        self.device = resolve_device(c.device)
        if c.bf16 and self.device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            warnings.warn("TrainConfig.bf16=True on a CPU without bfloat16 products (no AVX-512 BF16 or ARM BF16): "
                          "torch emulates them, tens of times slower than float32; set bf16=False on this machine",
                          RuntimeWarning, stacklevel=2)
        self.model = model.to(self.device)
        self.train_ids = train_ids
        self.val_ids = val_ids
        params = self.model.parameters()
        no_decay = no_decay_params(self.model)
        self.optimizer = AdamW(params, lr=c.max_lr, betas=c.betas, weight_decay=c.weight_decay, no_decay=no_decay)
        self.generator = torch.Generator().manual_seed(c.seed)
        torch.manual_seed(c.seed)
        self.step = 0
        self.history: list[dict] = []
        self.best_val_loss = math.inf
        self.best_state: dict[str, torch.Tensor] | None = None

    def _autocast(self):
        if not self.config.bf16:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def train_step(self) -> dict:
        """Take one optimizer step and return its record (also appended to ``history``).

        Returns:
            dict with ``step`` (the new count), ``loss`` (float, nats, before the update),
            ``lr`` (used for this step), ``grad_norm`` (pre-clip global norm), ``tokens``
            (tokens seen so far).

        Steps:
            1. Batch from ``get_lm_batch`` with ``self.generator``; move it to ``self.device``.
            2. lr from ``cosine_with_warmup`` at the *current* step; store it on the optimizer
               (``test_trainer_uses_schedule``).
            3. Forward under ``self._autocast()`` and ``lm_cross_entropy``.
            4. ``zero_grad``, backward, ``clip_grad_norm_`` with ``grad_clip``, optimizer step
               (``test_trainer_step_order``).
            5. Increment ``self.step``; record and return the dict.
        """
        c = self.config
        self.model.train()
        # BEGIN SOLUTION
        x, y = get_lm_batch(self.train_ids, c.batch_size, c.context, generator=self.generator)
        x, y = x.to(self.device), y.to(self.device)
        lr = cosine_with_warmup(self.step, warmup_steps=c.warmup_steps, max_steps=c.max_steps,
                                max_lr=c.max_lr, min_lr=c.min_lr)
        self.optimizer.lr = lr
        with self._autocast():
            logits = self.model(x)                                            # (B, T, V)
        loss = lm_cross_entropy(logits.float(), y)
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = clip_grad_norm_(self.model.parameters(), c.grad_clip)
        self.optimizer.step()
        self.step += 1
        record = {"step": self.step, "loss": float(loss.detach()), "lr": lr, "grad_norm": grad_norm,
                  "tokens": self.step * c.batch_size * c.context}
        # END SOLUTION
        self.history.append(record)
        return record

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean validation loss over ``eval_batches`` fixed batches (eval mode, no dropout).

        The batches come from a generator seeded with ``seed + 1`` each call, so successive
        evaluations compare like with like.

        Raises:
            ValueError: the trainer has no validation stream.
        """
        if self.val_ids is None:
            raise ValueError("Trainer.evaluate needs val_ids")
        c = self.config
        gen = torch.Generator().manual_seed(c.seed + 1)
        losses = []
        with eval_mode(self.model):                    # the mode comes back even on an exception
            for _ in range(c.eval_batches):
                x, y = get_lm_batch(self.val_ids, c.batch_size, c.context, generator=gen)
                with self._autocast():
                    logits = self.model(x.to(self.device))
                losses.append(float(lm_cross_entropy(logits.float(), y.to(self.device))))
        return sum(losses) / len(losses)

    def fit(self, num_steps: int | None = None, *, progress: bool = True, keep_best: bool = True,
            checkpoint_path: str | Path | None = None, checkpoint_every: int = 0) -> list[dict]:
        """Run ``num_steps`` steps (default: up to ``max_steps``) with a tqdm bar showing tokens/s.

        Every ``eval_every`` steps (and after the last) it evaluates, stores ``val_loss``
        in that step's record, and with ``keep_best`` copies the weights when the
        validation loss improves. With ``checkpoint_path`` it saves a resumable checkpoint
        every ``checkpoint_every`` steps and at the end.

        Returns:
            ``self.history``.
        """
        c = self.config
        end = c.max_steps if num_steps is None else self.step + num_steps
        bar = tqdm(total=max(0, end - self.step), disable=not progress, desc="train", unit="step", dynamic_ncols=True)
        t0, tok0 = time.perf_counter(), self.step * c.batch_size * c.context
        while self.step < end:
            rec = self.train_step()
            last = self.step == end
            if self.val_ids is not None and ((c.eval_every and self.step % c.eval_every == 0) or last):
                rec["val_loss"] = self.evaluate()
                if keep_best and rec["val_loss"] < self.best_val_loss:
                    self.best_val_loss = rec["val_loss"]
                    self.best_state = self.model.state_dict()
            if checkpoint_path and ((checkpoint_every and self.step % checkpoint_every == 0) or last):
                self.save_checkpoint(checkpoint_path)
            tok_s = (rec["tokens"] - tok0) / max(time.perf_counter() - t0, 1e-9)
            post = {"loss": f"{rec['loss']:.3f}", "tok/s": f"{tok_s:,.0f}"}
            if "val_loss" in rec:
                post["val"] = f"{rec['val_loss']:.3f}"
            bar.set_postfix(post, refresh=False)
            bar.update(1)
        bar.close()
        return self.history

    # -- checkpoints ---------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path) -> None:
        """Write everything needed to resume bit-identically (atomic: temp file + rename).

        Contents: model and optimizer state, step, history, best weights, the batch
        generator's state and the global torch RNG state (dropout), and the config.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "config": asdict(self.config),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "history": self.history,
            "best_val_loss": self.best_val_loss,
            "best_state": self.best_state,
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
        }
        save_checked(state, path)

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore a checkpoint written by ``save_checkpoint`` into this trainer, after checking
        it against the sha256 recorded beside it (``<path>.sha256``; see ``load_checked``).

        Raises:
            FileNotFoundError: no file at ``path``.
            ValueError: the file does not match its recorded sha256 or size, or has no record
                (see ``load_checked``); the checkpoint was written with a different
                ``TrainConfig`` (the message lists the differing fields).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no trainer checkpoint at {path}")
        state = load_checked(path)
        mine = asdict(self.config)
        diff = {k: (state["config"].get(k), v) for k, v in mine.items()
                if k != "device" and _norm(state["config"].get(k)) != _norm(v)}
        if diff:
            raise ValueError(f"checkpoint {path} was written with another TrainConfig: {diff}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.history = list(state["history"])
        self.best_val_loss = float(state["best_val_loss"])
        self.best_state = state["best_state"]
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])


def _checksum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_checked(state: dict, path: str | Path) -> None:
    """``torch.save`` a checkpoint atomically (temp file + fsync + rename) and record its sha256
    and size beside it in ``<path>.sha256`` (one line: ``<hex sha256> <bytes> <file name>``).
    Provided: the one place checkpoints are written, so a resume can refuse a damaged file.

    A failed save (a full disk: ``OSError`` errno ENOSPC; Ctrl-C) removes its temporaries and
    re-raises, leaving the previous checkpoint and its record as they were; temporaries a killed
    run left (``<path>.tmp``, ``<path>.tmp.sha256``) are removed by the next save. ``torch.save``
    writes through a file object opened here: given a path, its zip writer reports a full disk as
    a ``RuntimeError`` ("enforce fail at inline_container.cc"), through a file the ``OSError``
    (errno ENOSPC, or EFBIG past a file-size limit) comes back, with a message naming the file,
    what happened and that the previous checkpoint is unchanged."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    side_tmp = _checksum_path(tmp)
    try:
        try:
            with open(tmp, "wb") as f:
                torch.save(state, f)
        except (OSError, RuntimeError) as exc:
            os_error = exc if isinstance(exc, OSError) else exc.__context__
            if not isinstance(os_error, OSError) and "inline_container" not in str(exc):
                raise                                           # not a write that failed
            why = os_error.strerror if isinstance(os_error, OSError) else "the file system refused the write"
            raise OSError(getattr(os_error, "errno", None) or errno.EIO,
                          f"could not save the checkpoint {path}: {why} (a full disk or a file-size limit); free "
                          "some space or choose another folder, then run again: the previous checkpoint is unchanged",
                          str(path)) from None
        record = f"{_sha256(tmp)} {tmp.stat().st_size} {path.name}\n"
        with open(side_tmp, "w") as f:
            f.write(record)
            f.flush()
            os.fsync(f.fileno())
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        tmp.replace(path)
        side_tmp.replace(_checksum_path(path))
    finally:
        tmp.unlink(missing_ok=True)
        side_tmp.unlink(missing_ok=True)


def load_checked(path: str | Path) -> dict:
    """Load a checkpoint written by ``save_checked`` (tensors only, onto the CPU), after checking
    its size and sha256 against ``<path>.sha256``.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: no ``<path>.sha256`` beside it (an older or hand-copied checkpoint), or the file
            does not match it (truncated, bit-flipped, or replaced); the message names the file and
            the fix: delete the checkpoint to start the run over (or restore both files together).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    side = _checksum_path(path)
    fix = f"delete {path} (and {side.name}) to start the run over, or restore both files together"
    try:
        expected, size = side.read_text().split()[:2]
        size = int(size)
    except FileNotFoundError:
        raise ValueError(f"checkpoint {path} has no recorded checksum ({side.name} is missing), so a damaged file "
                         f"cannot be told apart; {fix}") from None
    except (ValueError, OSError) as exc:
        raise ValueError(f"checkpoint record {side} is unreadable ({exc}); {fix}") from exc
    got_size = path.stat().st_size
    if got_size != size or _sha256(path) != expected:
        raise ValueError(f"checkpoint {path} does not match its recorded sha256/size ({got_size:,} bytes, "
                         f"recorded {size:,}): it is truncated or corrupted; {fix}")
    return torch.load(path, map_location="cpu", weights_only=True)


def _norm(v):
    return list(v) if isinstance(v, tuple) else v


@torch.no_grad()
def stream_loss(model: Module, ids, *, context: int, batch_size: int = 16, bf16: bool = False) -> float:
    """Mean next-token loss (nats) over a whole stream, in non-overlapping windows.

    Deterministic (no sampling): windows start at 0, context, 2·context, ...; the tail
    shorter than a window is dropped. Used for the losses recorded in model manifests.

    Args:
        model: ids (B, T) -> logits (B, T, V).
        ids: 1-D stream with at least context + 1 tokens.
        context: window length T.
        batch_size: windows per forward pass.
        bf16: use bfloat16 autocast on the model's device.

    Raises:
        TypeError: ``ids`` not a tensor or NumPy array of integer ids; ``context`` or ``batch_size``
            not an int; ``bf16`` not a bool.
        ValueError: ``context`` or ``batch_size`` < 1, or the stream is shorter than context + 1.
    """
    check_stream(ids, "stream_loss")
    context = check_int(context, "context", where="stream_loss")
    batch_size = check_int(batch_size, "batch_size", where="stream_loss")
    if not isinstance(bf16, bool):
        raise TypeError(f"stream_loss: bf16 must be True or False, got {type(bf16).__name__} {bf16!r:.60}")
    n_windows = (len(ids) - 1) // context
    if n_windows < 1:
        raise ValueError(f"stream of {len(ids)} tokens is shorter than context + 1 = {context + 1}")
    device = model.device
    total, count = 0.0, 0
    ctx = torch.autocast(device_type=device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    with eval_mode(model):                             # the mode comes back even on an exception
        for start in range(0, n_windows, batch_size):
            idx = (torch.arange(start, min(start + batch_size, n_windows)).unsqueeze(1) * context
                   + torch.arange(context + 1))
            if isinstance(ids, torch.Tensor):
                w = ids[idx].long()
            else:
                import numpy as np
                w = torch.from_numpy(np.asarray(ids)[idx.numpy()].astype(np.int64))
            with ctx:
                logits = model(w[:, :-1].to(device))
            loss = lm_cross_entropy(logits.float(), w[:, 1:].to(device))
            total += float(loss) * w.shape[0]
            count += w.shape[0]
    return total / count
