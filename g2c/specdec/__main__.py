"""``python -m g2c.specdec "Once upon a time"``: watch speculative decoding work.

Loads a drafter and a target from the StoryLM ladder, continues the prompt with greedy
speculative decoding, and prints the continuation with the accepted draft tokens marked
apart from the tokens the target made itself (correction and bonus tokens): green on a
terminal, ``[in brackets]`` otherwise. Then the ``SpecStats``.

    python -m g2c.specdec "Once upon a time" --drafter StoryLM-1M --target StoryLM-30M -k 4

Errors are one line on stderr naming what you typed, with exit status 1 (2 when part of
the course code is not written yet): ``-k`` below 1, a negative ``--max-new-tokens``, an
empty prompt, a ``--device`` this machine does not have. A prompt longer than the target's
window (256 tokens on the ladder) is not an error: a note says that the models read only
its last 256 tokens.
"""

from __future__ import annotations

import argparse
import sys
from itertools import groupby

GREEN, RESET = "\033[32m", "\033[0m"
NEEDS_SOLUTIONS = (
    "python -m g2c.specdec runs your own code, and part of it is not written yet:\n  {err}\n"
    "Finish it, or run with the reference solutions: G2C_APPLY_SOLUTIONS=specdec "
    "(or G2C_APPLY_SOLUTIONS=01-11,specdec while the stack modules are unfinished too)."
)


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
        out.append((f"{GREEN}{run}{RESET}" if color else f"[{run}]") if is_draft else run)
    return "".join(out)


def fail(message: str) -> int:
    """Print one line on stderr in the user's terms; return exit status 1."""
    print(f"python -m g2c.specdec: {message}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m g2c.specdec", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt", nargs="?", default="Once upon a time")
    ap.add_argument("--drafter", default="StoryLM-1M")
    ap.add_argument("--target", default="StoryLM-30M")
    ap.add_argument("-k", type=int, default=4, help="draft tokens per target pass (default 4)")
    ap.add_argument("--max-new-tokens", type=int, default=60)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    args = ap.parse_args(argv)
    if args.k < 1:
        return fail(f"-k {args.k}: draft at least one token per target pass (-k 1 or more)")
    if args.max_new_tokens < 0:
        return fail(f"--max-new-tokens {args.max_new_tokens}: the number of tokens to add must be 0 or more")

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
            try:
                models[flag] = load_model(name, device=device)
            except ValueError as err:                   # an unknown model name
                return fail(f"{flag} {name}: {err}")
        (target, tokenizer), (drafter, _) = models["--target"], models["--drafter"]
        prompt_ids = tokenizer.encode(args.prompt)
        if not prompt_ids:
            return fail("the prompt is empty; give some text to continue, e.g. \"Once upon a time\"")
        window = min(target.max_seq_len, drafter.max_seq_len)
        if len(prompt_ids) > window:
            print(f"python -m g2c.specdec: note: the prompt is {len(prompt_ids)} tokens but the models read only "
                  f"the last {window} (their context window); the text before those is ignored", file=sys.stderr)
        passes: list[tuple[list[int], int]] = []
        out, stats = speculative_generate(target, drafter, prompt_ids, args.max_new_tokens, k=args.k,
                                          eos_id=tokenizer.eot_id,
                                          on_pass=lambda emitted, n: passes.append((list(emitted), n)))
    except NotImplementedError as err:
        print(NEEDS_SOLUTIONS.format(err=err), file=sys.stderr)
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
    print(f"k={args.k}: {stats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
