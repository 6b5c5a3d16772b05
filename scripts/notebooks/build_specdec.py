#!/usr/bin/env python3
"""Build notebooks/clean/specdec-draft-and-verify.ipynb (no outputs stored).

    python scripts/notebooks/build_specdec.py
"""

from pathlib import Path

import nbformat as nbf

ROOT = Path(__file__).resolve().parents[2]
cells = []


def md(text):
    cells.append(nbf.v4.new_markdown_cell(text.strip()))


def code(text):
    cells.append(nbf.v4.new_code_cell(text.strip()))


md("""
# Speculative decoding: draft, verify, accept

A cheap **drafter** proposes `k` tokens; the **target** scores the whole block in one forward
pass; we keep the longest agreeing prefix plus one token from the target (the correction at the
first disagreement, or the bonus token after a full match). Greedy verification gives *exactly*
the target's greedy text. This notebook runs it on the StoryLM ladder: StoryLM-1M and -5M
draft for StoryLM-30M.

Run it with your own code (`./notebook.sh specdec`) or with the reference solutions
(`G2C_APPLY_SOLUTIONS=01-11,specdec ./notebook.sh specdec`). Lesson: `docs/beyond/specdec.md`.
`G2C_QUICK=1` shrinks every loop (CI uses it).
""")

code("""
import os

import matplotlib.pyplot as plt
import torch

from g2c.assets.artifacts import load_model
from g2c.nn import time_call
from g2c.sampling import generate
from g2c.specdec import (MTPHead, SpecStats, greedy_verify, hidden_states, mtp_loss, mtp_propose,
                         speculative_generate)

QUICK = os.environ.get("G2C_QUICK") == "1"
torch.manual_seed(0)
THREADS = None  # torch's default; set 1 on a shared or busy CPU (oversubscription can cost 20x)
if THREADS:
    torch.set_num_threads(THREADS)
DEVICE = "cpu"  # try "auto" on a GPU or Apple silicon

target, tok = load_model("StoryLM-30M", device=DEVICE)
drafters = {name: load_model(name, device=DEVICE)[0] for name in ("StoryLM-1M", "StoryLM-5M")}
PROMPTS = [
    "Once upon a time",
    "Tom and his dog went to the park. They",
    "Lily wanted to bake a cake, but",
    "One day, a little bird found a shiny key.",
]
if QUICK:
    PROMPTS = PROMPTS[:2]
N_NEW = 24 if QUICK else 64
print(f"target {target.num_parameters():,} params; drafters:",
      {k: f"{m.num_parameters():,}" for k, m in drafters.items()})
""")

md("""
## 1. Losslessness on the ladder

StoryLM-1M drafts `k = 4` tokens at a time for StoryLM-30M. The output must be *byte-identical*
to plain greedy decoding with the target alone.
""")

code("""
drafter = drafters["StoryLM-1M"]
for prompt in PROMPTS:
    ids = torch.tensor(tok.encode(prompt))
    plain = generate(target, ids, N_NEW, temperature=0.0)
    spec, stats = speculative_generate(target, drafter, ids, N_NEW, k=4)
    same = torch.equal(plain, spec) and tok.decode(plain.tolist()) == tok.decode(spec.tolist())
    print(f"identical={same}  {stats}")
    print("   ", tok.decode(spec.tolist()).replace(chr(10), " / "))
    assert same, "speculative decoding changed the target's greedy output"
""")

md("""
**Question:** The drafter is a much weaker model and is often wrong. Why can its mistakes never
reach the output?
""")
md("""
**Answer:** Every emitted token is either a draft token that equals the target's own argmax at
that position (checked against the target's logits for the same prefix), or the target's argmax
itself (the correction or the bonus token). The drafter only decides how many tokens one target
pass can confirm, never which tokens are emitted.
""")

md("""
## 2. Tokens per target pass as k grows

For each drafter and `k` in {1, 2, 4, 8} we pool the counters over the prompts.
`tokens_per_pass` = emitted tokens / target passes; plain decoding has exactly 1.
""")

code("""
KS = [1, 2, 4, 8]
results = {}
for name, drafter in drafters.items():
    for k in KS:
        pooled = SpecStats()
        for prompt in PROMPTS:
            ids = torch.tensor(tok.encode(prompt))
            _, s = speculative_generate(target, drafter, ids, N_NEW, k=k)
            pooled.target_passes += s.target_passes
            pooled.drafted += s.drafted
            pooled.accepted += s.accepted
            pooled.generated += s.generated
        results[(name, k)] = pooled
        print(f"{name:11s} k={k}: acceptance {pooled.acceptance_rate:.2f}, "
              f"tokens/pass {pooled.tokens_per_pass:.2f}")

fig, ax = plt.subplots(figsize=(5, 3.2))
for name in drafters:
    ax.plot(KS, [results[(name, k)].tokens_per_pass for k in KS], marker="o", label=name)
ax.axhline(1.0, color="grey", ls=":", label="plain decoding")
ax.set_xlabel("k (drafted tokens per pass)")
ax.set_ylabel("tokens per target pass")
ax.set_xticks(KS)
ax.legend()
plt.show()
""")

md("""
**Question:** Why does tokens per pass grow more slowly than k, and why does the larger drafter
do better at every k?
""")
md("""
**Answer:** A block is accepted only up to its first miss, so position i of the draft counts only
if all earlier drafts matched: with a per-token agreement rate a the expected emitted tokens are
(1 - a^(k+1)) / (1 - a), which flattens out at 1 / (1 - a). The 5M model agrees with the 30M
target more often (higher a), so each pass confirms more of its block.
""")

md("""
## 3. Wall-clock honesty

Tokens per pass is not speed: the drafter's k forward passes cost time too, and on a CPU the
target's pass over k+1 positions costs more than over one. We time plain and speculative
greedy decoding side by side with `g2c.nn.time_call`: it synchronizes the device before
reading the clock, warms up first, reports the median of repeats and the number of CPU
threads torch used (set `THREADS` in the first cell to pin it; on a shared 2-core machine one
busy neighbour can make 2 threads 20x slower than 1).
""")

code("""
def timed(fn, repeats):
    return time_call(fn, device=target.device, warmup=1, repeats=repeats).median_s

REPEATS = 1 if QUICK else 3
ids = torch.tensor(tok.encode(PROMPTS[0]))
t_plain = timed(lambda: generate(target, ids, N_NEW, temperature=0.0), REPEATS)
rows = [("plain (30M alone)", "-", N_NEW / t_plain, 1.0)]
for name, drafter in drafters.items():
    for k in (2, 4):
        out = {}
        t = timed(lambda: out.update(s=speculative_generate(target, drafter, ids, N_NEW, k=k)[1]), REPEATS)
        rows.append((name, k, out["s"].generated / t, out["s"].tokens_per_pass))
print(f"{'drafter':18s} {'k':>2s} {'tok/s':>8s} {'tok/pass':>9s} {'speedup':>8s}")
for name, k, tps, tpp in rows:
    print(f"{name:18s} {str(k):>2s} {tps:8.1f} {tpp:9.2f} {tps / rows[0][2]:8.2f}")
print(f"(device {target.device}, {torch.get_num_threads()} torch threads, median of {REPEATS} after 1 warm-up)")
""")

md("""
**Question:** On this machine, is the speedup as large as tokens per pass? Name two costs that
tokens per pass leaves out.
""")
md("""
**Answer:** No: the measured speedup is smaller. Tokens per pass ignores (1) the drafter's own k
serial forward passes per round and (2) that the target's verification pass scores k+1
positions instead of one, which is nearly free on a GPU (memory-bound) but costs extra compute
on a CPU. Our loop also recomputes the whole context every pass (no KV cache), which inflates
both sides. (See the cost model in section 6.)
""")

md("""
## 4. Multi-token prediction: a drafter that lives inside the target

`MTPHead` reads the frozen StoryLM-5M trunk state h_t plus the embedding of token t+1 and
predicts token t+2. We train only the head with the course AdamW on the training split, then
compare its two-ahead top-1 accuracy with the base model's one-ahead accuracy.
""")

code("""
from g2c.assets.data import load_token_stream, prepare, tokenize_splits
from g2c.pretraining import get_lm_batch
from g2c.training import AdamW

try:
    train_ids, val_ids = load_token_stream("train"), load_token_stream("val")
except FileNotFoundError:  # data/ not prepared yet: use $G2C_TINYSTORIES (see ./datasets.sh)
    prepare(os.environ.get("G2C_TINYSTORIES"))
    tokenize_splits(tok)
    train_ids, val_ids = load_token_stream("train"), load_token_stream("val")

base = drafters["StoryLM-5M"]
head = MTPHead(base)
opt = AdamW(head.parameters(), lr=1e-3, weight_decay=0.0)
gen = torch.Generator().manual_seed(0)
STEPS, B, T = (30, 8, 64) if QUICK else (300, 16, 128)
losses = []
for step in range(STEPS):
    x, _ = get_lm_batch(train_ids, B, T, generator=gen)
    with torch.no_grad():
        h = hidden_states(base, x)                          # (B, T, D), frozen trunk
    logits = head(h[:, :-1], x[:, 1:])                      # (B, T-1, V): row t predicts x[t+2]
    loss = mtp_loss(logits, x)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(float(loss.detach()))
plt.figure(figsize=(5, 3))
plt.plot(losses)
plt.xlabel("step")
plt.ylabel("MTP loss (nats)")
plt.show()

@torch.no_grad()
def accuracies(n_batches):
    g = torch.Generator().manual_seed(1)
    one = two = count = 0
    for _ in range(n_batches):
        x, _ = get_lm_batch(val_ids, B, T, generator=g)
        h = hidden_states(base, x)
        base_pred = (h @ base.token_embed.weight.t()).argmax(-1)      # (B, T): predicts x[t+1]
        head_pred = head(h[:, :-1], x[:, 1:]).argmax(-1)              # (B, T-1): predicts x[t+2]
        one += (base_pred[:, :-2] == x[:, 1:-1]).sum().item()
        two += (head_pred[:, :-1] == x[:, 2:]).sum().item()
        count += x[:, 2:].numel()
    return one / count, two / count

acc1, acc2 = accuracies(2 if QUICK else 8)
print(f"base one-ahead top-1: {acc1:.3f}   head two-ahead top-1: {acc2:.3f}")
""")

md("""
**Question:** Why is the head's two-ahead accuracy lower than the base's one-ahead accuracy even
though it is given the true token t+1?
""")
md("""
**Answer:** It has far less capacity (one block on top of a frozen trunk, trained for a few
hundred steps) and it must predict further ahead from a trunk state that was trained only for
the next token; the state at position t was never asked to encode what comes after t+1.
""")

md("""
## 5. Self-speculation with the MTP head

Base and drafter are now the same network. One trunk pass gives the base's greedy token (which
is certain: it *is* the target) and the head's guess for the token after it. The next pass
verifies that guess with `greedy_verify` and, from the same hidden states, makes the next guess.
Each pass emits 1 or 2 tokens and the result must equal plain greedy decoding of the 5M model.
""")

code("""
@torch.no_grad()
def mtp_self_speculate(base, head, prompt_ids, max_new_tokens):
    ids = torch.as_tensor(prompt_ids, dtype=torch.long)
    nxt, guess = mtp_propose(base, head, ids)             # pass 1: a certain token + a guess
    stats = SpecStats()
    stats.record(drafted=0, accepted=0, generated=1)
    ids = torch.cat([ids, torch.tensor([nxt])])
    while stats.generated < max_new_tokens:
        block = torch.cat([ids, torch.tensor([guess])])
        h = hidden_states(base, block[-base.max_seq_len:].unsqueeze(0))[0]   # (T, D)
        rows = h[-2:] @ base.token_embed.weight.t()                           # (2, V)
        accepted, token = greedy_verify(torch.tensor([guess]), rows)
        room = max_new_tokens - stats.generated
        new = ([guess] if accepted else []) + [token]
        new = new[:room]
        ids = torch.cat([ids, torch.tensor(new)])
        stats.record(drafted=1, accepted=min(accepted, len(new)), generated=len(new))
        anchor = h[-1] if accepted else h[-2]               # state of the last confirmed position
        guess = int(head(anchor.view(1, 1, -1), torch.tensor([[token]])).argmax(-1))
    return ids, stats

mtp_rows = []
for prompt in PROMPTS:
    ids = torch.tensor(tok.encode(prompt))
    plain = generate(base, ids, N_NEW, temperature=0.0)
    self_spec, st = mtp_self_speculate(base, head, ids, N_NEW)
    assert torch.equal(plain, self_spec), "self-speculation changed the output"
    mtp_rows.append(st)
    print(f"identical=True  {st}")
print(f"MTP self-speculation acceptance {sum(s.accepted for s in mtp_rows) / sum(s.drafted for s in mtp_rows):.2f}"
      f" vs separate drafters at k=1: " + ", ".join(f"{n} {results[(n, 1)].acceptance_rate:.2f}" for n in drafters))
""")

md("""
**Question:** Self-speculation drafts only one token per pass. What does it save compared with a
separate drafter, and what limits it?
""")
md("""
**Answer:** It needs no second model and no extra forward passes: the guess comes from a small
head on hidden states the target computes anyway, so drafting is almost free (c ≈ 0). It is
limited by the head's accuracy and by drafting a single token; deeper MTP stacks (DeepSeek-V3)
or several heads (Medusa) draft further ahead.
""")

md("""
## 6. The cost model

With draft cost c (one drafter forward in units of one target forward), each round costs
1 + k·c target-equivalents and emits E[accepted] + 1 tokens. We measure c, compute the
emitted tokens per target-equivalent unit of the best run, and solve for the per-token
acceptance rate a at which k = 4 breaks even: (1 − a^(k+1)) / (1 − a) = 1 + k·c.
""")

code("""
def forward_time(model, n=64, repeats=3 if not QUICK else 1):
    x = torch.randint(0, model.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    return timed(lambda: model(x), repeats)

t_target = forward_time(target)
costs = {name: forward_time(m) / t_target for name, m in drafters.items()}
best = max(results, key=lambda key: results[key].tokens_per_pass / (1 + key[1] * costs[key[0]]))
s = results[best]
units = s.tokens_per_pass / (1 + best[1] * costs[best[0]])
print("draft cost c:", {n: round(c, 3) for n, c in costs.items()})
print(f"best: {best[0]} k={best[1]}: {s.tokens_per_pass:.2f} tokens/pass -> {units:.2f} tokens per target-equivalent")

def break_even(k, c):
    lo, hi = 0.0, 1.0 - 1e-9
    for _ in range(60):
        a = (lo + hi) / 2
        emitted = (1 - a ** (k + 1)) / (1 - a)
        lo, hi = (a, hi) if emitted < 1 + k * c else (lo, a)
    return (lo + hi) / 2

for name, c in costs.items():
    print(f"{name}: break-even per-token acceptance at k=4: {break_even(4, c):.2f}")
""")

md("""
**Question:** Using the numbers above, which drafter is worth it at k = 4, and what would change
on a GPU where the target's verification pass over k+1 tokens costs about as much as one token?
""")
md("""
**Answer:** A drafter pays off when its measured per-token acceptance exceeds the break-even
rate for its cost c; the tiny 1M drafter has a low break-even because it is so cheap, while the
5M drafter accepts more but costs more per draft. On a GPU decoding is memory-bound, so the
target's pass over k+1 positions costs about one step and c shrinks further for small drafters;
speedups then approach the tokens-per-pass numbers of section 2.
""")

nb = nbf.v4.new_notebook()
nb["cells"] = cells
nb["metadata"]["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
out = ROOT / "notebooks" / "clean" / "specdec-draft-and-verify.ipynb"
nbf.write(nb, out)
print(f"wrote {out.relative_to(ROOT)}")
