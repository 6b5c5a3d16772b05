"""A frozen target's final states over a token stream, computed once and kept on disk.

The drafters of ``g2c.assets.recipes.drafters`` all learn from a frozen model's view of the
training stream: the distilled StoryLM-1M from StoryLM-30M's next-token distributions,
the MTP heads and the EAGLE drafter from the base's final states h_t. Those come from one
forward pass of the base over the stream, cut into non-overlapping windows of ``context``
tokens (the states a window's position j sees are those of a j+1-token context, exactly
what inference over that window computes). The pass is written to
``runs/features/<base>/<split>-ctx<context>.f16`` (a float16 ``numpy.memmap`` of shape
(num_windows * context, D)) with a ``.json`` record beside it; the logits are never stored:
they are ``unembed(h)``, one matrix product away (StoryLM-30M: 1.6 GB of states instead of
13 GB of logits for the training split).

The pass is resumable (the record counts finished windows) and is redone when the base's
weights change (the record holds their sha256).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from g2c.assets.artifacts import verify_artifact
from g2c.assets.data import load_token_stream
from g2c.course import REPO_ROOT
from g2c.course.files import write_text_atomic

FEATURES_DIR = REPO_ROOT / "runs" / "features"

__all__ = ["FEATURES_DIR", "GREEDY_PROMPT_TOKENS", "MIXED_PROMPT_TOKENS", "Features", "FinalStates", "LayerFeatures",
           "layer_features", "target_continuations", "target_features"]


class Features:
    """A stream's tokens and the base's states, window by window.

    Attributes:
        ids: (N,) int64 CPU tensor, the first N = num_windows * context tokens of the stream.
        states: (N, D) float16 ``numpy.memmap``; row i is the base's final (post-LayerNorm)
            state at token i, computed inside i's window.
        context: window length; ``num_windows``.
    """

    def __init__(self, ids: torch.Tensor, states: np.ndarray, context: int) -> None:
        self.ids, self.states, self.context = ids, states, context
        self.num_windows = ids.numel() // context

    def batch(self, windows: torch.Tensor, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(ids (B, context) int64, states (B, context, D) float32) of the given window numbers, on ``device``."""
        c = self.context
        ids = torch.stack([self.ids[w * c:(w + 1) * c] for w in windows.tolist()])               # (B, context)
        states = np.stack([self.states[w * c:(w + 1) * c] for w in windows.tolist()])            # (B, context, D)
        return ids.to(device), torch.from_numpy(states.astype(np.float32)).to(device)


def _stream_ids(split: str, context: int, max_windows: int | None) -> tuple[torch.Tensor, int]:
    """The first whole windows of ``split``'s token stream: (ids (N,) int64, number of windows)."""
    stream = load_token_stream(split)
    num_windows = len(stream) // context
    if max_windows is not None:
        num_windows = min(num_windows, max_windows)
    return torch.from_numpy(np.asarray(stream[:num_windows * context]).astype(np.int64)), num_windows


def _cached_states(base, base_name: str, stem: str, want: dict, ids: torch.Tensor, context: int, shape: tuple,
                   batch_size: int, compute, desc: str, progress: bool, log,
                   seed: tuple[Path, int] | None = None, dtype=np.float16, indexed: bool = False) -> np.ndarray:
    """Fill ``runs/features/<base>/<stem>.f16`` (float16 memmap of ``shape``, rows in token order) with
    ``compute(x)`` for each batch of windows x (n, context), resuming from its ``.json`` record when
    ``want`` (plus the weights' sha256) matches it; returns the finished memmap, read-only. ``seed``
    (path, n): a finished cache of the same stream whose first n windows are copied in before a fresh
    pass starts, so the pass computes only the windows past n. ``dtype`` ``np.int32``: a token cache
    (``<stem>.i32``, ``target_continuations``); ``indexed``: call ``compute(x, first)`` with the number of
    x's first window."""
    folder = FEATURES_DIR / base_name
    folder.mkdir(parents=True, exist_ok=True)
    path, record_path = folder / f"{stem}{_suffix(dtype)}", folder / f"{stem}.json"
    want = {**want, "weights_sha256": verify_artifact(base_name)["files"]["model.safetensors"]}
    num_windows = want["num_windows"]
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    done = record.get("done", 0) if {k: record.get(k) for k in want} == want and path.is_file() else 0
    states = np.memmap(path, dtype=dtype, mode="r+" if done else "w+", shape=shape)
    if seed is not None and done < seed[1]:             # a smaller finished pass: its windows are ours, copy them
        seed_path, n = seed
        log(f"features: {desc}: the first {n} windows copied from {seed_path.name}")
        old = np.memmap(seed_path, dtype=dtype, mode="r", shape=(n * context, *shape[1:]))
        for start in range(done * context, n * context, 64 * context):            # 64 windows at a time
            end = min(start + 64 * context, n * context)
            states[start:end] = old[start:end]
        del old
        states.flush()
        done = n
        write_text_atomic(record_path, json.dumps({**want, "done": done}))
    if done < num_windows:
        from tqdm.auto import tqdm

        size = int(np.prod(shape)) * np.dtype(dtype).itemsize               # bytes on disk
        shown = f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"
        log(f"features: {desc}: {num_windows} windows of {context}, from window {done}; {shown} "
            f"({np.dtype(dtype).name}) in {path}")
        device = base.token_embed.weight.device
        bar = tqdm(total=num_windows, initial=done, desc=desc, disable=not progress)
        while done < num_windows:
            n = min(batch_size, num_windows - done)
            x = ids[done * context:(done + n) * context].view(n, context).to(device)            # (n, context)
            rows = (compute(x, done) if indexed else compute(x)).reshape(n * context, *shape[1:])
            rows = rows.to(torch.float16 if dtype == np.float16 else torch.int32)
            states[done * context:(done + n) * context] = rows.cpu().numpy()
            done += n
            if done % (8 * batch_size) == 0 or done == num_windows:
                states.flush()
                write_text_atomic(record_path, json.dumps({**want, "done": done}))  # never a half record
            bar.update(n)
        bar.close()
    return np.memmap(path, dtype=dtype, mode="r", shape=shape)


def _suffix(dtype) -> str:
    """A cache file's suffix: ``.f16`` for layer states (float16), ``.i32`` for token ids (int32)."""
    return ".f16" if np.dtype(dtype) == np.float16 else ".i32"


def _finished_caches(base_name: str, prefix: str, want: dict, dtype=np.float16) -> list[tuple[int, Path]]:
    """(n, path) of every finished cache ``<prefix>-w<n>`` of ``dtype`` (layer states float16, token ids
    int32) whose record matches ``want`` (bar the window count) and the base's current weights."""
    suffix = _suffix(dtype)
    folder = FEATURES_DIR / base_name
    if not folder.is_dir():
        return []
    sha = verify_artifact(base_name)["files"]["model.safetensors"]
    found = []
    for record_path in folder.glob(f"{prefix}-w*.json"):
        try:
            record = json.loads(record_path.read_text())
        except (OSError, ValueError):
            continue
        n = record.get("num_windows")
        same = all(record.get(k) == v for k, v in want.items() if k != "num_windows")
        if same and record.get("weights_sha256") == sha and isinstance(n, int) \
                and record.get("done") == n and record_path.with_suffix(suffix).is_file():
            found.append((n, record_path.with_suffix(suffix)))
    return found


@torch.no_grad()
def target_features(base, base_name: str, split: str, *, context: int = 256, batch_size: int = 16,
                    progress: bool = True, log=print) -> Features:
    """The base's final states over ``split``'s token stream, computed (or resumed) once.

    Args:
        base: the loaded ``TransformerLM`` (eval mode, float32), ``base_name``'s weights.
        base_name: its artifact name (the cache folder and the weights' sha256 come from it).
        split: ``"train"`` or ``"val"`` (``./datasets.sh`` prepares them).
        context: window length, <= ``base.max_seq_len``.
        batch_size: windows per forward pass.

    Returns:
        ``Features`` over the first ``(len(stream) // context) * context`` tokens.

    Raises:
        ValueError: context outside [2, base.max_seq_len].
        FileNotFoundError: the split is not prepared (run ``./datasets.sh``).
    """
    if not 2 <= context <= base.max_seq_len:
        raise ValueError(f"context must be in [2, max_seq_len={base.max_seq_len}], got {context}")
    ids, num_windows = _stream_ids(split, context, None)
    want = {"base": base_name, "split": split, "context": context, "num_windows": num_windows,
            "dim": base.embedding_dim}
    states = _cached_states(base, base_name, f"{split}-ctx{context}", want, ids, context,
                            (num_windows * context, base.embedding_dim), batch_size,
                            lambda x: base.hidden_states(x), f"{base_name} states ({split})", progress, log)
    return Features(ids, states, context)



class LayerFeatures(Features):
    """A stream's tokens and the base's states at several layers, window by window.

    Attributes:
        states: (N, L + 1, D) float16 ``numpy.memmap``: for token i, the outputs of the chosen
            blocks (in ``layers`` order) then the final (post-LayerNorm) state.
        layers: the block indices kept.
    """

    def __init__(self, ids: torch.Tensor, states: np.ndarray, context: int, layers: tuple[int, ...]) -> None:
        super().__init__(ids, states, context)
        self.layers = layers

    def batch(self, windows: torch.Tensor, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(ids (B, context) int64, states (B, context, L + 1, D) float32) of the given windows."""
        return super().batch(windows, device)


GREEDY_PROMPT_TOKENS = 32
MIXED_PROMPT_TOKENS = (32, 64, 96, 128, 160, 192, 224)   # "mixed": the corpus/greedy border moves along the window
PROMPT_GROUP = 64                                        # windows that share one prompt length (one decode batch)


def _greedy_prefix(split: str, prompt_tokens: int | tuple[int, ...]) -> str:
    """The name every cache of a greedy text starts with: ``<split>-greedy-p<P>`` (lengths joined by "-")."""
    lengths = prompt_tokens if isinstance(prompt_tokens, tuple) else (prompt_tokens,)
    return f"{split}-greedy-p{'-'.join(map(str, lengths))}"


@torch.no_grad()
def target_continuations(base, base_name: str, split: str, *, context: int = 256,
                         prompt_tokens: int | tuple[int, ...] = GREEDY_PROMPT_TOKENS, max_windows: int | None = None,
                         batch_size: int = 64, progress: bool = True, log=print) -> tuple[torch.Tensor, int]:
    """The base's own greedy continuations of ``split``'s windows: the training text a drafter sees
    when it learns from what the target WRITES rather than from the corpus (self-distillation:
    Medusa-2, Cai et al. 2024, section 2.3.2; the DFlash drafters learn from target-generated
    responses). At temperature 0 the target's next token is a function of the text so far, so a
    drafter that guesses several tokens ahead from one context (the block drafter's slot 8) can learn
    it; from the corpus, slot j must guess j - 1 human-written tokens it never sees.

    Each window keeps its first ``prompt_tokens`` corpus tokens; the other ``context - prompt_tokens``
    are the base's greedy continuation, by module 16's cached decoding on the fast path (float32,
    ``g2c.kvcache.fast``: its logits lie within 1e-5 of the teaching path's, so a near tie may break
    the other way; the cache is training data, not a test oracle). A tuple of lengths takes turns by
    groups of ``PROMPT_GROUP`` (64) windows (window w keeps ``prompt_tokens[(w // 64) % len]``;
    ``MIXED_PROMPT_TOKENS``, the ``mixed`` source): at inference a drafter meets the target's text a
    few tokens after a human prompt as well as deep into its own text, and one short prompt shows it
    mostly the second. (Measured in the lineage lesson, "trained on the target's own text": at
    512,000 tokens the mix did not beat the single 32-token prompt.)

    Args:
        base: the loaded ``TransformerLM`` (eval mode, float32), ``base_name``'s weights.
        base_name, split, context: as ``layer_features``.
        prompt_tokens: corpus tokens kept at the start of each window, in [1, context - 1], or a
            non-empty tuple of such lengths taken in turn by groups of 64 windows.
        max_windows: continue at most this many windows (None: all).
        batch_size: windows decoded together.

    Returns:
        (ids (N,) int64 CPU tensor, number of windows), N = windows x context. Written to
        ``runs/features/<base>/<split>-greedy-p<P>-ctx<context>-w<n>.i32`` (P: the lengths joined by
        "-"; int32, 1 KB a window) with a ``.json`` record: resumable, redone when the weights change.
        A finished text of FEWER windows (a smaller budget's, same lengths) seeds it: its windows are
        copied and only the rest are decoded (the seed's last group may have been decoded in a smaller
        batch, so a near tie there may break otherwise than in a fresh pass; the text is training data).

    Raises:
        ValueError: context outside [2, base.max_seq_len]; a prompt length outside [1, context - 1] (or
            an empty tuple).
        FileNotFoundError: the split is not prepared (run ``./datasets.sh``).
    """
    from g2c.kvcache import KVCache
    from g2c.kvcache.fast import fast_model
    from g2c.kvcache.forward import cached_forward

    if not 2 <= context <= base.max_seq_len:
        raise ValueError(f"context must be in [2, max_seq_len={base.max_seq_len}], got {context}")
    lengths = prompt_tokens if isinstance(prompt_tokens, tuple) and prompt_tokens else (prompt_tokens,)
    if not all(isinstance(p, int) and not isinstance(p, bool) and 1 <= p < context for p in lengths):
        raise ValueError(f"prompt_tokens must be an int in [1, context - 1 = {context - 1}] or a non-empty tuple of "
                         f"them, got {prompt_tokens!r}")
    ids, num_windows = _stream_ids(split, context, max_windows)
    want = {"base": base_name, "split": split, "context": context, "num_windows": num_windows,
            "prompt_tokens": prompt_tokens if len(lengths) == 1 and not isinstance(prompt_tokens, tuple)
            else list(lengths), "decoding": "greedy"}
    fast = fast_model(base)

    def compute(x: torch.Tensor, first: int) -> torch.Tensor:   # (n, context) corpus -> (n, context) the base's text
        n, out = x.shape[0], x.clone()
        keep = torch.tensor([lengths[(first + i) // PROMPT_GROUP % len(lengths)] for i in range(n)],
                            device=x.device)                                                  # (n,) each prompt
        start = int(keep.min())
        cache = KVCache.for_model(fast, n)
        logits = cached_forward(fast, x[:, :start], cache)
        for pos in range(start, context):
            out[:, pos] = torch.where(pos < keep, x[:, pos], logits[:, -1].argmax(-1))     # corpus until its P
            if pos + 1 < context:
                logits = cached_forward(fast, out[:, pos:pos + 1], cache)
        return out

    prefix = f"{_greedy_prefix(split, lengths)}-ctx{context}"
    stem = f"{prefix}-w{num_windows}"
    smaller = [(n, path) for n, path in _finished_caches(base_name, prefix, want, np.int32)
               if n < num_windows]    # a smaller budget's text: its windows are the first of ours (same turns)
    tokens = _cached_states(base, base_name, stem, want, ids, context, (num_windows * context,), batch_size, compute,
                            f"{base_name} greedy text ({split})", progress, log, dtype=np.int32, indexed=True,
                            seed=max(smaller)[::-1] if smaller else None)
    return torch.from_numpy(np.asarray(tokens).astype(np.int64)), num_windows


@torch.no_grad()
def layer_features(base, base_name: str, split: str, layers: tuple[int, ...], *, context: int = 256,
                   max_windows: int | None = None, batch_size: int = 8, progress: bool = True,
                   log=print, source: str = "corpus") -> LayerFeatures:
    """The base's block outputs at ``layers`` and its final states over ``split``, computed once.

    The drafters that fuse several layers (EAGLE-3, the block drafter) and Medusa learn from these;
    four rows of D per token is four times the final-state cache (StoryLM-30M's whole training split:
    about 4 x 1.6 GB, the size is logged before the pass starts), so a recipe may keep only the
    first ``max_windows`` windows (the shipped recipes: 1,200; a budgeted run, every window).

    Args:
        base, base_name, split, context, batch_size: as ``target_features``.
        layers: block indices (0-based) whose outputs to keep, before the final state.
        max_windows: keep at most this many windows (None: all).
        source: ``"corpus"`` (the split's text); ``"greedy"``: the base's own greedy continuation of
            each window after its first ``GREEDY_PROMPT_TOKENS`` (``target_continuations``; its own
            caches, ``<split>-greedy-p32-layers...``); ``"mixed"``: the same after a prompt length that
            takes turns over ``MIXED_PROMPT_TOKENS`` by groups of 64 windows (``<split>-greedy-p32-64-...``).

    Returns:
        ``LayerFeatures``; written to ``runs/features/<base>/<split>-layers<l1-l2-..>-ctx<context>-w<n>.f16``
        with a ``.json`` record (resumable, redone when the weights change). A finished cache of MORE
        windows of the same stream, layers and weights is read instead (its first n windows): the
        drafters of one budget round it up to their own whole steps, and one pass serves them all. A
        finished cache of FEWER windows seeds a new one (its windows are copied, only the rest are
        computed), so a larger budget after a smaller one pays only for the new windows; the smaller
        file stays (delete it to free its disk).

    Raises:
        ValueError: context outside [2, base.max_seq_len], a layer outside the base, a ``source``
            other than "corpus", "greedy" and "mixed", or a greedy source whose context is not longer
            than its (longest) prompt, so no token would be the base's.
        FileNotFoundError: the split is not prepared (run ``./datasets.sh``).
    """
    if not 2 <= context <= base.max_seq_len:
        raise ValueError(f"context must be in [2, max_seq_len={base.max_seq_len}], got {context}")
    layers = tuple(int(i) for i in layers)
    if not all(0 <= i < len(base.blocks) for i in layers):
        raise ValueError(f"layers {layers} must lie in [0, {len(base.blocks)})")
    if source not in ("corpus", "greedy", "mixed"):
        raise ValueError(f"source must be 'corpus' (the split's text), 'greedy' or 'mixed' (the base's own "
                         f"continuations after one or several prompt lengths), got {source!r}")
    want = {"base": base_name, "split": split, "context": context, "dim": base.embedding_dim,
            "layers": list(layers)}
    if source == "corpus":
        ids, num_windows = _stream_ids(split, context, max_windows)
        prefix = split
    else:
        prompt = GREEDY_PROMPT_TOKENS if source == "greedy" else MIXED_PROMPT_TOKENS
        longest = max(prompt) if isinstance(prompt, tuple) else prompt
        if context <= longest:        # said here: the caller chose a source and a context, not prompt lengths
            raise ValueError(f"source={source!r} keeps the first {longest} corpus tokens of each window and "
                             f"continues the rest, so it needs context > {longest}, got {context}")
        ids, num_windows = target_continuations(base, base_name, split, context=context, max_windows=max_windows,
                                                prompt_tokens=prompt, progress=progress, log=log)
        prefix = _greedy_prefix(split, prompt)
        want["source"] = prefix
    want["num_windows"] = num_windows

    def compute(x: torch.Tensor) -> torch.Tensor:            # (n, context) -> (n, context, L+1, D)
        h = base.token_embed.weight[x] + base.pos_embed.weight[torch.arange(x.shape[1], device=x.device)]
        kept = {}
        for i, blk in enumerate(base.blocks):
            h = blk(h)
            kept[i] = h
        return torch.stack([kept[i] for i in layers] + [base.ln_final(h)], dim=2)

    cache = f"{prefix}-layers{'-'.join(map(str, layers))}-ctx{context}"
    stem = f"{cache}-w{num_windows}"
    finished = _finished_caches(base_name, cache, want)      # one scan, one weights check
    larger = [(n, path) for n, path in finished if n > num_windows]
    smaller = [(n, path) for n, path in finished if n < num_windows]
    if larger:                        # budgets round up to whole steps: one pass serves every drafter of a budget
        n, path = min(larger)         # the smallest larger cache: its first windows are the ones asked for
        log(f"features: {base_name} layer states ({split}): the first {num_windows} windows of {path.name}")
        full = np.memmap(path, dtype=np.float16, mode="r", shape=(n * context, len(layers) + 1, base.embedding_dim))
        return LayerFeatures(ids, full[:num_windows * context], context, layers)
    states = _cached_states(base, base_name, stem, want, ids, context,
                            (num_windows * context, len(layers) + 1, base.embedding_dim), batch_size, compute,
                            f"{base_name} layer states ({split})", progress, log,
                            seed=max(smaller)[::-1] if smaller else None)    # the largest smaller one seeds
    if smaller:                       # never deleted for the user: a run may still read it; say what it costs
        gb = sum(path.stat().st_size for _, path in smaller) / 1e9
        log(f"features: {', '.join(path.name for _, path in sorted(smaller))}: redundant now, its windows are the "
            f"first of {stem}.f16 (which serves every smaller budget); delete it (and its .json) to free {gb:.2f} GB")
    return LayerFeatures(ids, states, context, layers)


class FinalStates(Features):
    """The final states of a ``LayerFeatures`` cache, read as a ``Features`` (no copy).

    A budgeted run of a drafter that reads only the base's final state (EAGLE, MTP) learns from the
    same windows as the layer-fusing drafters at that budget, so the lineage compares methods on one
    data stream, and one feature pass serves every drafter.

    Attributes: as ``Features``; ``states`` is the (N, L + 1, D) memmap, of which ``batch`` reads
    the last row of each token.
    """

    def __init__(self, layered: LayerFeatures) -> None:
        super().__init__(layered.ids, layered.states, layered.context)

    def batch(self, windows: torch.Tensor, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(ids (B, context) int64, final states (B, context, D) float32) of the given windows."""
        c = self.context
        ids = torch.stack([self.ids[w * c:(w + 1) * c] for w in windows.tolist()])               # (B, context)
        states = np.stack([self.states[w * c:(w + 1) * c, -1] for w in windows.tolist()])        # (B, context, D)
        return ids.to(device), torch.from_numpy(states.astype(np.float32)).to(device)
