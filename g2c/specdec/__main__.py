"""``python -m g2c.specdec "Once upon a time"``: watch speculative decoding work.

Loads a drafter and a target from the StoryLM ladder, continues the prompt with greedy
speculative decoding, and prints the continuation with the accepted draft tokens marked
apart from the tokens the target made itself (correction and bonus tokens): green on a
terminal, ``[in brackets]`` otherwise. Then the ``SpecStats``.

    python -m g2c.specdec "Once upon a time"                      # StoryLM-1M-distilled drafts for StoryLM-30M
    python -m g2c.specdec "Once upon a time" --drafter StoryLM-1M --target StoryLM-30M -k 4
    python -m g2c.specdec "Once upon a time" --drafter StoryLM-30M-EAGLE -k 4     # feature-level drafting
    python -m g2c.specdec "Once upon a time" --drafter StoryLM-30M-Medusa -k 8    # specdec-lineage: Medusa tree
    python -m g2c.specdec "Once upon a time" --drafter StoryLM-30M-EAGLE -k 8 --width 4   # EAGLE-2 tree
    python -m g2c.specdec "Once upon a time" --repetition-penalty 1.3 --stop "The end" --logprobs
    python -m g2c.specdec "Once upon a time" --drafter StoryLM-30M-EAGLE -k 5 --fast --draft-dtype bfloat16

Errors are one line on stderr naming what you typed, with exit status 1 (2 when part of
the course code is not written yet, and argparse's usage and exit status 2 for a flag whose
value is not even the right type, ``--repetition-penalty abc``, or names no model,
``--drafter StoryLM-1M-distiled``: that one is refused before anything loads, with the closest
names): ``-k`` below 1, a negative ``--max-new-tokens``, an
empty prompt, a ``--device`` this machine does not have. A prompt longer than the target's
window (256 tokens on the ladder) is not an error: a note says that the models read only
its last 256 tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from itertools import groupby

GREEN, RESET = "\033[32m", "\033[0m"
NEEDS_SOLUTIONS = (
    "python -m g2c.specdec runs your own code, and part of it is not written yet:\n  {err}\n{advice}"
)


def unwritten_advice(err: NotImplementedError, argv: list[str] | None = None) -> str:
    """What to do when an exercise this command runs is unwritten: finish it, or run with the answer key for
    every module the student has not edited (computed from the registry; never one they edited). ``argv``:
    the command's own arguments, repeated in the suggested command so it can be pasted (None: ``...``)."""
    import re
    import shlex

    from g2c.course import module_ids, selector_for
    from g2c.course.scaffolds import worked_modules

    m = re.search(r"module ([0-9a-z][0-9a-z-]*): ", str(err))
    owner = m.group(1) if m else None
    worked = worked_modules()
    untouched = [i for i in module_ids() if i not in worked]
    lines = [f"Finish module {owner} and grade it with ./test.sh {owner}." if owner else ""]
    if untouched and owner not in worked:
        no_cache = argv is not None and "--no-cache" in argv          # the user's command has it already
        lines.append(f"Or run this command with the answer key for the modules you have not edited: "
                     f"G2C_APPLY_SOLUTIONS={selector_for(untouched)} .venv/bin/python -m g2c.specdec "
                     f"{'...' if argv is None else shlex.join(argv)}"
                     + ("" if no_cache else " (or --no-cache when only module 16's cache is unwritten)"))
    return " ".join(line for line in lines if line)


def render(tokenizer, prompt_ids: list[int], passes: list[tuple[list[int], int]], *, color: bool) -> str:
    """The continuation as text, accepted draft runs marked (colour or brackets)."""
    ids = list(prompt_ids)
    text_so_far = tokenizer.decode(ids)
    pieces: list[tuple[str, bool]] = []                 # (text, is_accepted_draft)
    for emitted, num_accepted in passes:
        for i, tok in enumerate(emitted):
            ids.append(tok)
            text = tokenizer.decode(ids)
            pieces.append((text[len(text_so_far):], i < num_accepted))
            text_so_far = text
    out = []
    for is_draft, group in groupby(pieces, key=lambda piece: piece[1]):
        run = "".join(text for text, _ in group)
        out.append(_mark(run, color=color) if is_draft else run)
    return "".join(out)


def _mark(run: str, *, color: bool) -> str:
    """One accepted draft run, coloured, or bracketed line by line: a run that crosses a line
    break becomes ``[end.]`` + newline + ``[Next]``, so no bracket spans two lines."""
    opening, closing = (GREEN, RESET) if color else ("[", "]")
    return "\n".join(f"{opening}{part}{closing}" if part else "" for part in run.split("\n"))


def fail(message: str) -> int:
    """Print one line on stderr in the user's terms; return exit status 1."""
    print(f"python -m g2c.specdec: {message}", file=sys.stderr)
    return 1


def _uses_sampling_loop(args) -> bool:
    """specdec-sampling: anything but a greedy, static-k LM drafter runs ``speculative_sample``."""
    return not _is_lineage(args) and (
            args.temperature != 0.0 or args.controller != "static" or args.drafter.lower() in ("mtp", "ngram")
            or _is_head(args.drafter) or args.top_k is not None or args.top_p is not None or _controls(args))


def _controls(args) -> dict:
    """The engine's controls the user asked for (repetition penalty, stop strings, logprobs), as keywords."""
    out = {}
    if args.repetition_penalty != 1.0:
        out["repetition_penalty"] = args.repetition_penalty
    if args.stop:
        out["stop_strings"] = list(args.stop)
    if args.logprobs:
        out["logprobs"] = True
    return out


def _is_head(name: str) -> bool:
    """A shipped drafter that lives on the target's states (``StoryLM-30M-EAGLE``, ``*-MTP``, and the
    specdec-lineage drafters ``*-Medusa``, ``*-EAGLE3``, ``*-Block``)."""
    return name.lower().endswith(("-eagle", "-mtp", "-medusa", "-eagle3", "-block"))


def _is_lineage(args) -> bool:
    """specdec-lineage: Medusa, EAGLE-3 and the block drafter, and EAGLE with ``--width`` > 1 (an
    EAGLE-2 dynamic tree), run ``g2c.specdec.lineage.lineage_generate``."""
    name = args.drafter.lower()
    return name.endswith(("-medusa", "-eagle3", "-block")) or (name.endswith("-eagle") and args.width > 1)


def _lineage_run(args, target, head, prompt_ids, eos_id, *, on_pass, decode=None):
    """Wrap a lineage head in its drafter and run the cached tree loop with ``-k`` nodes per pass."""
    import torch

    from g2c.specdec.lineage import BlockDrafter, Eagle3Drafter, EagleTreeDrafter, MedusaDrafter, lineage_generate

    name = args.drafter.lower()
    if name.endswith("-medusa"):
        drafter = MedusaDrafter(head)
    elif name.endswith("-eagle3"):
        drafter = Eagle3Drafter(head, width=args.width)
    elif name.endswith("-block"):
        drafter = BlockDrafter(head)
    else:
        drafter = EagleTreeDrafter(head, width=args.width)
    return lineage_generate(target, drafter, prompt_ids, args.max_new_tokens, num_nodes=args.k,
                            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            generator=torch.Generator().manual_seed(args.seed), eos_id=eos_id, on_pass=on_pass,
                            decode=decode, **_controls(args))


def _sampled_run(args, target, drafter_model, prompt_ids, eos_id, *, on_pass, use_cache=False, decode=None):
    """Wrap the named drafter, build the controller, run ``g2c.specdec.sampling.loop.speculative_sample``
    (with module 16's KV cache on the target and an LM drafter when ``use_cache``)."""
    import torch

    from g2c.specdec.sampling.controllers import CostModelK, HeuristicK, StaticK
    from g2c.specdec.sampling.drafters import LMDrafter, NGramDrafter
    from g2c.specdec.sampling.eagle import MTPDrafter
    from g2c.specdec.sampling.loop import speculative_sample

    name = args.drafter.lower()
    if name == "ngram":
        drafter = NGramDrafter()
    elif _is_head(name):
        from g2c.specdec.sampling.eagle import EagleDrafter

        make = EagleDrafter if name.endswith("-eagle") else MTPDrafter
        drafter = make(drafter_model, sample=args.temperature > 0)
    elif name == "mtp":                       # the head main trained (a table target gets one here)
        head = drafter_model if drafter_model is not None else _train_mtp_head(target, steps=args.mtp_steps,
                                                                                 seed=args.seed)
        drafter = MTPDrafter(head, sample=args.temperature > 0)
    else:
        drafter = LMDrafter(drafter_model, sample=args.temperature > 0, use_cache=use_cache)
    controller = {"static": StaticK, "heuristic": HeuristicK, "cost": CostModelK}[args.controller](args.k)
    return speculative_sample(target, drafter, prompt_ids, args.max_new_tokens, temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p, generator=torch.Generator().manual_seed(args.seed),
                              eos_id=eos_id, controller=controller, on_pass=on_pass, use_cache=use_cache,
                              decode=decode, **_controls(args))


def _pairing_problem(args) -> str | None:
    """What the model names alone show to be wrong, before anything loads: a head drafter with a target other
    than the base it reads, or ``-k`` beyond the shipped models' window (``g2c.transformer.LADDER``; the run checks
    the loaded models' own windows again)."""
    from g2c.assets.artifacts import DRAFTERS
    from g2c.transformer.config import LADDER

    if _is_head(args.drafter):                # EAGLE / MTP / lineage heads draft for the base they were trained on
        base = DRAFTERS[args.drafter]["base"]
        if args.target != base:
            return f"--drafter {args.drafter} drafts from {base}'s hidden states; use --target {base}"
    names = [args.target] + [DRAFTERS.get(args.drafter, {}).get("base", args.drafter)]
    windows = [LADDER[n].max_seq_len for n in names if n in LADDER]
    return _window_problem(args.k, min(windows)) if windows else None


def _window_problem(k: int, window: int) -> str | None:
    """The one rule for every route (``g2c.assets.cli.draft_room_problem``), as this command says it."""
    from g2c.assets.cli import draft_room_problem

    tail = draft_room_problem(k, window, whose="the models'", nodes=True)
    return None if tail is None else f"-k {k}: {tail}; lower -k"


def _seed():
    from g2c.assets.cli import seed

    return seed()


def _train_mtp_head(base, *, steps: int, seed: int):
    """A fresh ``MTPHead`` on the frozen target, trained ``steps`` steps on the training split
    (``g2c.specdec.train_mtp_head``: batches of 8 windows of 64 tokens, AdamW lr 1e-3)."""
    import torch

    from g2c.assets.data import load_token_stream
    from g2c.specdec import train_mtp_head

    try:
        stream = load_token_stream("train")
    except FileNotFoundError as err:
        raise ValueError(f"--drafter mtp trains a head on the training split, which is missing: {err}") from err
    print(f"training an MTPHead on the frozen target for {steps} steps ...", file=sys.stderr, flush=True)
    head, _ = train_mtp_head(base, stream, steps=steps, batch_size=8, seq_len=64, lr=1e-3,
                             generator=torch.Generator().manual_seed(seed))
    return head


def main(argv: list[str] | None = None) -> int:
    # names are checked as the flags are read, before any model loads
    from g2c.assets.cli import model_name

    ap = argparse.ArgumentParser(prog="python -m g2c.specdec", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt", nargs="?", default="Once upon a time")
    ap.add_argument("--drafter", default="StoryLM-1M-distilled", type=model_name(extra=("mtp", "ngram")),
                    help="default StoryLM-1M-distilled (the best shipped drafter); a StoryLM, StoryLM-30M-EAGLE or "
                         "StoryLM-30M-MTP (they draft for StoryLM-30M), StoryLM-5M-MTP (for StoryLM-5M), mtp (a head "
                         "trained now) or ngram; specdec-lineage: StoryLM-30M-Medusa, StoryLM-30M-EAGLE3, "
                         "StoryLM-30M-Block (and StoryLM-30M-EAGLE with --width > 1), with -k nodes per pass")
    ap.add_argument("--target", default=None, type=model_name(language_models=True),
                    help="the model whose output is reproduced (default StoryLM-30M; for an MTP/EAGLE head "
                         "drafter, the base it was trained on)")
    ap.add_argument("-k", type=int, default=4, help="draft tokens per target pass (default 4)")
    ap.add_argument("--max-new-tokens", type=int, default=60)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    # specdec-sampling: any drafter by name (a StoryLM, a shipped drafter, "mtp", "ngram"), sampling, dynamic k
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--top-p", type=float, default=None)
    ap.add_argument("--seed", type=_seed(), default=0, help="torch.Generator seed for sampling, in [0, 2**63 - 1]")
    ap.add_argument("--controller", choices=("static", "heuristic", "cost"), default="static",
                    help="draft length per round: static k, transformers' heuristic, or the cost model")
    ap.add_argument("--width", type=int, default=1,
                    help="specdec-lineage: EAGLE-2 expansion width for StoryLM-30M-EAGLE / -EAGLE3 (1 = a chain; "
                         "2 to 32 = a dynamic tree of -k nodes)")
    ap.add_argument("--mtp-steps", type=int, default=None,
                    help="--drafter mtp: steps to train a head on the target (default 60)")
    ap.add_argument("--no-cache", action="store_true",
                    help="recompute the whole context every pass instead of keeping module 16's KV cache "
                         "(greedy: g2c.specdec.sampling.speculative_generate_cached; sampled, n-gram or dynamic k: "
                         "speculative_sample(use_cache=True)); the cache is used when the models are "
                         "TransformerLMs (an MTP head's drafter keeps a cache of its own)")
    ap.add_argument("--fast", action="store_true",
                    help="run the target on module 16's fast path (g2c.kvcache.fast_model, float32: the same "
                         "tokens, fused passes); needs the KV cache (TransformerLM models, not --no-cache)")
    ap.add_argument("--draft-dtype", choices=("float32", "bfloat16", "float16"), default=None,
                    help="the drafter's model or head as a fast copy with its weight products in this dtype "
                         "(g2c.kvcache.fast_model(drafter, dtype=...)), whatever --fast says of the target; the "
                         "target keeps its own dtype, so the output does not change, only how many drafts are "
                         "accepted and how fast they come (bfloat16 is fast on CPUs with AVX512-BF16 or AMX, slow "
                         "elsewhere; float16 suits Apple GPUs)")
    ap.add_argument("--repetition-penalty", type=float, default=1.0,
                    help="module 11's CTRL penalty on tokens already said (1.0 = off, > 1 discourages repeats); "
                         "lossless: the speculative output follows plain decoding with the same penalty")
    ap.add_argument("--stop", action="append", default=[], metavar="TEXT",
                    help="stop right after the token that completes TEXT in the new text (repeatable)")
    ap.add_argument("--logprobs", action="store_true",
                    help="print each new token's log-probability under the target (nats) and the perplexity")
    args = ap.parse_args(argv)
    if args.target is None:
        args.target = "StoryLM-30M"
        if _is_head(args.drafter):
            from g2c.assets.artifacts import DRAFTERS

            args.target = {n.lower(): d["base"] for n, d in DRAFTERS.items()}.get(args.drafter.lower(), args.target)
    # Everything that needs no model is checked before the first import of the course's code, so a fresh
    # clone (exercises unwritten) answers a mistyped flag with the flag, not with "not written yet".
    if not args.prompt.strip():
        return fail("the prompt is empty" + (" (only whitespace)" if args.prompt else "")
                    + "; give some text to continue, e.g. \"Once upon a time\"")
    from g2c.assets.artifacts import device_problem

    problem = device_problem(args.device)            # torch alone: module 03's resolve_device may be unwritten
    if problem:
        return fail(f"--device {args.device or repr(args.device)}: {problem}")
    if args.k < 1:
        return fail(f"-k {args.k}: draft at least one token per target pass (-k 1 or more)")
    pairing = _pairing_problem(args)
    if pairing:
        return fail(pairing)
    if args.drafter == args.target:
        print(f"python -m g2c.specdec: note: --drafter and --target are both {args.target}: every draft is accepted, "
              "so this checks the loop, not a speed-up (each round pays the drafter's k steps of the target's cost)",
              file=sys.stderr)
    if args.controller != "static" and args.k > 16:
        return fail(f"-k {args.k} with --controller {args.controller}: -k is the adaptive controller's first "
                    "draft length, and it adapts within 1..16: give -k 16 or less")
    if not 1 <= args.width <= 32:
        return fail(f"--width {args.width}: the EAGLE-2 expansion width is 1 (a chain) to 32 (nodes expanded per "
                    "depth; 4 suits the course's models)")
    if args.width > 1 and not args.drafter.lower().endswith(("-eagle", "-eagle3")):
        return fail(f"--width {args.width} grows an EAGLE-2 tree; it needs --drafter StoryLM-30M-EAGLE or "
                    "StoryLM-30M-EAGLE3")
    if not 0 <= args.max_new_tokens <= 2**31 - 1:
        return fail(f"--max-new-tokens {args.max_new_tokens}: the number of tokens to add must be 0 to 2**31 - 1")
    if not 0.0 <= args.temperature < float("inf"):   # also refuses nan
        return fail(f"--temperature {args.temperature}: use 0 for greedy decoding or a finite value > 0 to sample")
    if args.top_k is not None and args.top_k < 1:
        return fail(f"--top-k {args.top_k}: keep at least one token (--top-k 1 or more), or leave it out")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:   # also refuses nan
        return fail(f"--top-p {args.top_p}: the nucleus mass is in (0, 1], e.g. --top-p 0.9, or leave it out")
    if args.top_p is not None:
        from g2c.sampling.model import check_top_p
        try:
            check_top_p(args.top_p)
        except ValueError:
            return fail(f"--top-p {args.top_p} rounds to 0 in float32 and would keep no token; any value below the "
                        "top token's probability keeps only that token: e.g. --top-p 1e-9")
    if args.temperature == 0.0 and (args.top_k is not None or args.top_p is not None):
        flags = " and ".join(f for f, v in (("--top-k", args.top_k), ("--top-p", args.top_p)) if v is not None)
        one = " and " not in flags
        return fail(f"{flags} shape{'s' if one else ''} sampled draws; greedy decoding (--temperature 0, the default) "
                    f"always takes the top token, so {'it' if one else 'they'} would change nothing: add --temperature "
                    f"0.8 (say) or drop {'it' if one else 'them'}")
    if not 0.0 < args.repetition_penalty < float("inf"):   # also refuses nan
        return fail(f"--repetition-penalty {args.repetition_penalty}: use a finite value > 0 (1.0 = off, 1.2 is "
                    "common)")
    if any(not s for s in args.stop):
        return fail("--stop '': an empty stop text would stop before the first token; give the text to stop at")
    if args.mtp_steps is not None and args.drafter.lower() != "mtp":
        return fail(f"--mtp-steps {args.mtp_steps} trains the head of --drafter mtp; --drafter {args.drafter} "
                    "trains nothing: drop --mtp-steps")
    if args.mtp_steps is None:
        args.mtp_steps = 60
    if args.mtp_steps < 1:
        return fail(f"--mtp-steps {args.mtp_steps}: train the head for at least 1 step (default 60)")
    if args.fast and args.no_cache:
        return fail("--fast runs the target's KV-cached passes fused: drop --no-cache")
    if args.draft_dtype is not None and args.drafter == "ngram":
        return fail(f"--draft-dtype {args.draft_dtype} sets the drafter model's products; --drafter ngram looks "
                    "tokens up in the prompt and has no model: drop --draft-dtype")

    import torch

    from g2c.assets.artifacts import ArtifactError, load_model
    from g2c.nn import resolve_device
    from g2c.specdec import speculative_generate

    try:
        try:
            device = resolve_device(args.device)
        except NotImplementedError:                     # a RuntimeError too: the unfinished scaffold
            raise
        except (RuntimeError, ValueError) as err:
            return fail(f"--device {args.device}: {err}")
        models = {}
        for flag, name in (("--target", args.target), ("--drafter", args.drafter)):
            if flag == "--drafter" and name.lower() in ("mtp", "ngram"):     # specdec-sampling: no model
                models[flag] = (None, None)
                continue
            try:
                models[flag] = load_model(name, device=device)
            except ValueError as err:                   # an unknown model name
                return fail(f"{flag} {name}: {err}")
        (target, tokenizer), (drafter, _) = models["--target"], models["--drafter"]
        if _is_head(args.drafter):            # the pairing was checked by name (_pairing_problem)
            target = drafter.base             # one copy of the target: the head's own base
        try:
            prompt_ids = tokenizer.encode(args.prompt)
        except UnicodeError as err:           # e.g. bytes the shell could not decode (surrogates)
            return fail(f"the prompt is not valid UTF-8 text ({err}); check the terminal's encoding or retype it")
        if not prompt_ids:
            return fail("the prompt is empty; give some text to continue, e.g. \"Once upon a time\"")
        window = min(target.max_seq_len, getattr(drafter, "max_seq_len", target.max_seq_len))
        if problem := _window_problem(args.k, window):     # again, on the loaded models' own windows
            return fail(problem)
        if len(prompt_ids) > window:
            print(f"python -m g2c.specdec: note: the prompt is {len(prompt_ids)} tokens but the models read only "
                  f"the last {window} (their context window); the text before those is ignored"
                  + ("; with --no-cache no pass has room for a draft, so every pass is a plain step (drop "
                     "--no-cache to draft)" if args.no_cache else ""), file=sys.stderr)
        passes: list[tuple[list[int], int]] = []
        from g2c.nn import synchronize
        from g2c.transformer import TransformerLM
        mtp_head = args.drafter.lower() == "mtp" and isinstance(target, TransformerLM)
        if mtp_head:                          # trained before the clock starts, on the teaching model
            drafter = _train_mtp_head(target, steps=args.mtp_steps, seed=args.seed)
        synchronize(target.device)
        started = time.perf_counter()
        cached = (not args.no_cache and isinstance(target, TransformerLM)
                  and (drafter is None or isinstance(drafter, TransformerLM) or _is_head(args.drafter) or mtp_head))
        if args.fast:
            if not cached:
                return fail("--fast runs the target's KV-cached passes fused: it needs TransformerLM models (the "
                            "target and a model drafter)")
            from g2c.kvcache import fast_model

            target = fast_model(target)       # drafters built on the teaching model accept it (unwrap)
        if args.draft_dtype is not None and drafter is not None:   # --drafter mtp: the head trained above
            from g2c.kvcache import fast_model

            drafter = fast_model(drafter, dtype=args.draft_dtype)   # a head keeps its teaching base: same target
        if _is_lineage(args):
            most = getattr(drafter, "block_size", None) if args.drafter.lower().endswith("-block") else None
            if most is not None and args.k > most:
                return fail(f"-k {args.k}: --drafter {args.drafter} fills at most {most} slots per pass (its "
                            f"block size); give -k {most} or less")
            if args.controller != "static" or args.no_cache:
                return fail(f"--drafter {args.drafter} drafts trees on the target's cached states (the node "
                            "budget is -k): drop --controller/--no-cache")
            out, stats = _lineage_run(args, target, drafter, prompt_ids, tokenizer.eot_id, decode=tokenizer.decode,
                                      on_pass=lambda emitted, n: passes.append((list(emitted), n)))
        elif _uses_sampling_loop(args):
            out, stats = _sampled_run(args, target, drafter, prompt_ids, tokenizer.eot_id, use_cache=cached,
                                      decode=tokenizer.decode,
                                      on_pass=lambda emitted, n: passes.append((list(emitted), n)))
        else:
            loop = speculative_generate
            if cached:  # module 16: both models keep a KV cache, rollback by pointer
                from g2c.specdec.sampling.cached import speculative_generate_cached as loop
            out, stats = loop(target, drafter, prompt_ids, args.max_new_tokens, k=args.k, eos_id=tokenizer.eot_id,
                              on_pass=lambda emitted, n: passes.append((list(emitted), n)))
        synchronize(target.device)
        seconds = time.perf_counter() - started
    except NotImplementedError as err:
        print(NEEDS_SOLUTIONS.format(err=err, advice=unwritten_advice(err, sys.argv[1:] if argv is None else argv)),
              file=sys.stderr)
        return 2
    except (ArtifactError, ValueError) as err:
        print(f"python -m g2c.specdec: {err}", file=sys.stderr)
        return 1

    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    new_ids = out[len(prompt_ids):].tolist()
    if not new_ids:
        body, legend = "", f"(no new tokens: --max-new-tokens is {args.max_new_tokens})"
    elif passes and sum(len(e) for e, _ in passes) == len(new_ids):
        body = render(tokenizer, prompt_ids, passes, color=color)
        legend = (f"{GREEN}green{RESET} = accepted draft tokens ({args.drafter})" if color
                  else f"[brackets] = accepted draft tokens ({args.drafter})")
        legend += f", plain = tokens made by the target ({args.target})"
    else:  # a student speculative_generate that does not call on_pass
        body = tokenizer.decode(new_ids)
        legend = "(no per-pass report: speculative_generate did not call on_pass, so drafts are not marked)"
    print(tokenizer.decode(prompt_ids) + body)
    print()
    print(legend)
    k_note = (" (an MTP head drafts 1 token per pass)"
              if args.k > 1 and args.drafter.lower().endswith("mtp") else "")
    sampled = f", temperature={args.temperature}, seed={args.seed}" if args.temperature > 0 else ""
    print(f"k={args.k}{sampled}: {stats}" if not _uses_sampling_loop(args) else
          f"k={args.k} ({args.controller}){k_note}, temperature={args.temperature}, seed={args.seed}: {stats}")
    logprobs = getattr(stats, "logprobs", None)
    if logprobs:
        import math

        mean = sum(logprobs) / len(logprobs)
        print("logprobs (nats, per new token): " + " ".join(f"{x:.2f}" for x in logprobs))
        print(f"mean {mean:.3f} nats/token, perplexity {math.exp(-mean):.2f} over {len(logprobs)} tokens")
    if stats.generated:
        threads = torch.get_num_threads()
        print(f"{stats.generated / seconds:.1f} tok/s ({stats.generated} tokens in {seconds:.2f} s, "
              f"{'KV cache' if cached else 'no cache'}{', fast path' if args.fast else ''}"
              f"{f', drafter in {args.draft_dtype}' if args.draft_dtype else ''}, "
              f"{threads} thread{'s' if threads != 1 else ''})",
              file=sys.stderr)  # timing varies run to run: stderr, so stdout stays reproducible
    return 0


if __name__ == "__main__":
    sys.exit(main())
