# %% [markdown]
# # Be the Verifier: the speculative-decoding calculator, simulated rounds and real ones
#
# The specdec module built draft-then-verify. This notebook asks *how fast* it can be, and
# checks the answer three ways:
#
# 1. **The calculator** (`g2c.specdec.theory`, provided): tokens per pass τ(α, k), its cap,
#    the two speed-up conventions, the optimal draft length, KV rollback, trees, the roofline.
# 2. **Be the Verifier**: sliders for α, k and the draft cost c, a button that plays rounds of
#    the i.i.d. model with *your* `simulate_rounds` (green bars: accepted drafts, amber star:
#    the target's own token, red crosses: the rejected tail) next to the theory.
# 3. **Real rounds**: StoryLM-1M drafting for StoryLM-30M, recorded with `on_pass`, drawn the
#    same way, and the measured per-position acceptance against the i.i.d. model.
#
# Lesson: `docs/beyond/specdec-lab.md`. `./notebook.sh specdec-lab` runs it on your own code, with
# the answer key for the modules it needs that you have not edited. Before you start:
# `./checkpoints.sh` (section 3 loads the ladder). `G2C_QUICK=1` shrinks every loop (CI uses it); without a
# Jupyter frontend the widget cell still draws one fixed simulation.

# %%
import os

import matplotlib.pyplot as plt
import torch

from g2c.assets import load_model
from g2c.specdec import speculative_generate
from g2c.specdec.lab.simulate import PassRecorder, draw_rounds, fit_alpha, per_position_acceptance, simulate_rounds
from g2c.specdec.theory import (
    bimodal_itl,
    emitted_distribution,
    expected_rollback,
    expected_tokens_per_pass,
    optimal_k,
    ridge_point,
    speculative_intensity,
    speedup_per_round,
    speedup_per_token,
    tau_cap,
    tree_expected_tokens,
)

QUICK = os.environ.get("G2C_QUICK") == "1"
DEVICE = "auto"   # CUDA, then MPS, then CPU
_ = torch.manual_seed(0)

# %% [markdown]
# ## 1. The calculator
#
# Under the i.i.d. model each draft is accepted with probability α until the first
# rejection, and the target's pass adds one token of its own, so a round emits
# $\tau(\alpha, k) = \dfrac{1 - \alpha^{k+1}}{1 - \alpha}$ tokens on average, never more than
# $1 / (1 - \alpha)$.
# The lecture's worked numbers, recomputed:

# %%
print(f"tau(0.85, 4) = {expected_tokens_per_pass(0.85, 4):.2f} tokens per pass, cap {tau_cap(0.85):.2f}")
for tau, c in [(2.5, 0.1), (3.5, 0.1), (2.0, 0.3)]:
    print(f"tau = {tau}, c_draft = {c}: speed-up {speedup_per_round(tau, c):.2f}x  (tau / (1 + c))")
print(f"per-token convention, alpha 0.85, k 4, c1 0.1: {speedup_per_token(0.85, 4, 0.1):.2f}x  "
      "((E[acc] + 1) / (1 + k c1))")
k_best, s_best = optimal_k(0.85, 0.1)
print(f"best k at alpha 0.85, c1 0.1: k = {k_best} ({s_best:.2f}x)")
print(f"rolled-back rows per round at k 4, alpha 0.85: {expected_rollback(0.85, 4):.2f}")
print(f"tree vs chain at a 4-token budget, a = 0.1 each: chain {tree_expected_tokens([-1, 0, 1, 2], [0.1] * 4):.2f}, "
      f"four siblings {tree_expected_tokens([-1] * 4, [0.1] * 4):.2f}")
itl = bimodal_itl(0.0418, 0.85, 1, 0.10)
print(f"70B MTP k = 1: rounds of {itl.round_s * 1e3:.1f} ms, mean ITL {itl.mean_s * 1e3:.1f} ms")
print(f"intensity at B 32, k 4, L 2048: {speculative_intensity(140e9, 32, 4, 2048, 320 * 1024):.0f} FLOP/byte "
      f"with kv = 320 KiB (the lecture says 104); ridge {ridge_point(989e12, 3.35e12):.0f}")

# %% [markdown]
# A **dynamic-k rule**. Engines re-estimate acceptance as traffic drifts and pick k for the
# next rounds. Write `choose_k(alpha_hat, c1)`: the k in 1..8 that maximises the per-token
# speed-up τ(α̂, k) / (1 + k c1), or 0 (switch speculation off) when even the best k does not
# beat plain decoding.

# %%
def choose_k(alpha_hat: float, c1: float) -> int:
    # BEGIN SOLUTION
    k, speedup = optimal_k(alpha_hat, c1, k_max=8)
    return k if speedup > 1.0 else 0
    # END SOLUTION


assert choose_k(0.85, 0.05) == 8 and choose_k(0.6, 0.05) == 4 and choose_k(0.05, 0.1) == 0
print({a: choose_k(a, 0.05) for a in (0.3, 0.5, 0.7, 0.85, 0.95)})

# %% [markdown]
# ## 2. Be the Verifier
#
# Move the sliders and press **Simulate**. Each row is one round: green bars are accepted
# drafts, the amber star is the target's own token (the correction at the first rejection,
# or the bonus after a full match), red crosses are the rejected draft and the aborted tail.
# The figure draws at most the first 20 rounds (its title says how many of how many); the title's
# τ and the speed-up under the figure count every round. Can you make the empirical speed-up beat
# theory? (Small samples are generous: try 10 rounds, then 1000.)
#
# Reopened the notebook and see "Error displaying widget: model not found"? The sliders live in
# the kernel that drew them: run the cell below again.

# %%
def play(alpha: float, k: int, c1: float, num_rounds: int, seed: int = 0):
    """Simulate first (an exercise error leaves no empty figure behind), then draw."""
    rounds = simulate_rounds(alpha, k, c1, num_rounds, generator=torch.Generator().manual_seed(seed))
    fig, ax = plt.subplots(figsize=(7, 6.5))
    draw_rounds(rounds, ax, max_rounds=min(num_rounds, 20), alpha=alpha)
    theory = speedup_per_token(alpha, k, c1)
    ax.set_xlabel(f"draft position\nempirical speed-up {rounds.speedup:.2f}x vs theory {theory:.2f}x "
                  f"(tau {rounds.tau:.2f} vs {expected_tokens_per_pass(alpha, k):.2f}, all {num_rounds} rounds)",
                  fontsize=9)
    plt.show()
    return rounds


try:
    import ipywidgets as widgets
    from IPython.display import display
except ImportError:  # the notebook extra is not installed: static drawing only
    widgets = None

# A frontend to click in: any run but the quick one (CI), or G2C_WIDGETS=1 (scripts/notebooks/screenshot.py).
FRONTEND = not QUICK or os.environ.get("G2C_WIDGETS") == "1"
if widgets is not None and FRONTEND:   # every picture goes into the widget's output, Simulate replaces it
    alpha_w = widgets.FloatSlider(value=0.85, min=0.0, max=1.0, step=0.01, description="alpha")
    k_w = widgets.IntSlider(value=4, min=1, max=12, description="k")
    c_w = widgets.FloatSlider(value=0.05, min=0.0, max=0.5, step=0.01, description="c per draft")
    n_w = widgets.IntSlider(value=20, min=1, max=2000, description="rounds")
    button = widgets.Button(description="Simulate", button_style="success")
    out = widgets.Output()
    state = {"seed": 0}

    def on_click(_):
        with out:
            out.clear_output(wait=True)
            try:
                play(alpha_w.value, k_w.value, c_w.value, n_w.value, seed=state["seed"])
            except NotImplementedError as err:   # shown in the widget (a callback's traceback would be hidden)
                print(err)
        state["seed"] += 1

    button.on_click(on_click)
    print("The widget below needs this cell's kernel: in a reopened notebook it reads \"model not found\" "
          "until you run this cell again.")
    display(widgets.VBox([widgets.HBox([alpha_w, k_w]), widgets.HBox([c_w, n_w]), button, out]))
    on_click(None)   # the first picture (seed 0), drawn inside the widget: Simulate replaces it
else:
    # No widgets (CI, a plain script, G2C_QUICK=1): nothing to click, so draw one fixed simulation.
    fixed = play(0.85, 4, 0.05, 20, seed=0)

# %% [markdown]
# ## 3. Real rounds: StoryLM-1M drafting for StoryLM-30M
#
# `speculative_generate(..., on_pass=recorder)` calls the recorder after every target pass
# with the emitted ids and how many of them are accepted drafts. `PassRecorder.rounds`
# turns that into the same `Rounds` the simulator returns (it drops each run's last pass,
# which the budget may have cut short).

# %%
from tqdm.auto import tqdm

try:
    target, tok = load_model("StoryLM-30M", device=DEVICE)
    drafter, _ = load_model("StoryLM-1M", device=DEVICE)
except FileNotFoundError as err:   # ArtifactMissingError: the ladder is not on disk
    raise RuntimeError("StoryLM-30M / StoryLM-1M not found: run ./checkpoints.sh in the repository root, "
                       "then re-run this notebook from the top (Run > Run All Cells)") from err
K = 4
PROMPTS = ["Once upon a time", "Lily and her mom went to the park. They",
           "Tom had a big red ball. One day,", "The little bird was sad because"]
if QUICK:
    PROMPTS = PROMPTS[:2]
NEW = 32 if QUICK else 96
recorder = PassRecorder()
per_prompt = {}
bar = tqdm(total=len(PROMPTS) * NEW, desc="1M drafts for 30M", unit="tok")   # minutes on a CPU
for text in PROMPTS:
    mine = PassRecorder()

    def both(emitted, num_accepted, mine=mine):
        recorder(emitted, num_accepted)
        mine(emitted, num_accepted)
        bar.update(len(emitted))

    ids, stats = speculative_generate(target, drafter, tok.encode(text), NEW, k=K, on_pass=both)
    recorder.end_run()
    one = mine.rounds(k=K)
    per_prompt[text] = (one.tau, fit_alpha(one), one.num_rounds)
bar.close()
# the per-prompt table after the bar (a bar between its rows would split it), ranked by alpha_hat
for text, (tau, a, n) in sorted(per_prompt.items(), key=lambda kv: -kv[1][1]):
    se = (a * (1 - a) / max(n * K, 1)) ** 0.5   # a rough binomial standard error over the n * K drafts
    print(f"{text!r:45}: tau {tau:.2f}, alpha_hat {a:.2f} +- {se:.2f} ({n} rounds)")
real = recorder.rounds(k=K, c=0.05, source="1M -> 30M, measured")
alpha_hat = fit_alpha(real)
print(f"{real.num_rounds} rounds, measured tau {real.tau:.2f}; i.i.d. fit alpha_hat = {alpha_hat:.3f} "
      f"-> tau(alpha_hat, {K}) = {expected_tokens_per_pass(alpha_hat, K):.2f}; "
      f"SpecStats-style acceptance rate accepted/drafted = {real.accepted.sum().item() / (K * real.num_rounds):.3f}")

sim = simulate_rounds(alpha_hat, K, 0.05, real.num_rounds, generator=torch.Generator().manual_seed(1))
fig, axes = plt.subplots(1, 2, figsize=(12, 6.5))
draw_rounds(real, axes[0], max_rounds=20)
draw_rounds(sim, axes[1], max_rounds=20, alpha=alpha_hat)
plt.tight_layout()
plt.show()

# %% [markdown]
# Per-position acceptance: of the rounds that reached draft position i, how many accepted
# it? The i.i.d. model says α̂ at every position.

# %%
rates, reached = per_position_acceptance(real)
sim_rates, _ = per_position_acceptance(simulate_rounds(alpha_hat, K, 0.0, 20_000,
                                                       generator=torch.Generator().manual_seed(2)))
for i in range(K):
    n = max(int(reached[i]), 1)
    se = (float(rates[i]) * (1 - float(rates[i])) / n) ** 0.5
    print(f"position {i + 1}: measured {rates[i]:.2f} +- {se:.2f} over {int(reached[i])} rounds, "
          f"i.i.d. model {sim_rates[i]:.2f}")
counts = torch.bincount(real.accepted, minlength=K + 1).tolist()
expected = [round(p * real.num_rounds, 1) for p in emitted_distribution(alpha_hat, K)]
print(f"rounds with 0..{K} accepted: measured {counts}, i.i.d. model {expected}")
fig, ax = plt.subplots(figsize=(5, 3))
ax.bar(range(1, K + 1), rates.tolist(), color="tab:green", label="measured")
ax.axhline(alpha_hat, color="black", ls="--", label=f"i.i.d. alpha_hat = {alpha_hat:.2f}")
ax.set_xticks(range(1, K + 1))
ax.set_xlabel("draft position")
ax.set_ylabel("P(accept | reached)")
ax.set_ylim(0, 1.3)   # headroom: the legend sits above the bars
ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
ax.legend(loc="upper center", ncol=2, fontsize=8)
plt.show()

# %% [markdown]
# **Question:** Is acceptance independent across positions for the 1M drafter? Compare the
# measured per-position rates with α̂ (mind the ± standard errors), the measured counts of
# rounds with 0..k accepted drafts with the i.i.d. model, and the per-prompt α̂ printed above.
# Where does the i.i.d. model hold on this ladder, and where does it break?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# Within one text, the i.i.d. model is a fair first approximation here: the per-position
# rates scatter around α̂ within about two standard errors, and τ(α̂, k) lands within a few
# hundredths of the measured τ. The conditional rates cannot show everything, though: they
# pool rounds from easy and hard stretches. What breaks independence is the text: on the full
# run (four prompts of 96 tokens) the per-prompt α̂ spread from 0.64 to 0.76, three times their
# standard errors of about ±0.04. Which prompt comes out easiest is not something the opening
# words predict, and a short run ranks them differently: with 96 tokens the stock opening
# "Once upon a time" came last (the 30M target soon takes the story somewhere specific that the
# 1M drafter cannot guess), with 32 tokens (G2C_QUICK=1) it came first. Within a story,
# stretches of boilerplate alternate with names and turns. Acceptance depends on the prefix,
# so a single α is an average over a task distribution; that is why a measured τ means nothing
# without the prompts it was measured on (the serving lab's two prompt sets show it), and why
# engines re-estimate α online (the dynamic-k rule above).
# <!-- END ANSWER -->
# <!-- BEGIN RUBRIC -->
# Full answer: (1) reads the numbers honestly: on the shipped ladder (1M -> 30M, k = 4, four
# prompts x 96 tokens) the per-position rates were 0.73, 0.66, 0.71, 0.63 against alpha_hat
# 0.69 (standard errors 0.04-0.07), accepted-count histogram [37, 33, 19, 17, 29] against the
# model's [41.6, 28.8, 19.9, 13.8, 30.9], measured tau 2.76 vs tau(alpha_hat) 2.73: no
# significant per-position effect at this sample size; (2) locates the dependence in the
# prefix/task, reading the ranked per-prompt table of the run itself (on that run the four
# alpha_hat spanned about 0.64 to 0.76, with "Once upon a time" lowest: an answer that
# assumes the stock opening is the easiest, against the printed table, loses this point);
# (3) draws the consequence: report tau with its
# prompt distribution; adapt k online. Claiming a strong per-position trend without checking the
# standard errors loses credit; so does calling the model exact.
# <!-- END RUBRIC -->

# %% [markdown]
# **Question:** The lecture quotes an effective arithmetic intensity of 104 FLOP/byte at
# B = 32, k = 4, L = 2048 for the 70B model. Recompute it with the lecture's own constants
# (2P = 140 GB, kv = 320 KiB per token). What do you get, what kv would give 104, and does
# the conclusion (speculation still under the ridge of 295 at B = 128) survive?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# With kv = 320 KiB: I = 140e9 · 32 · 5 / (140e9 + 32 · 2048 · 327,680) = 22.4e12 / 161.5e9 ≈ 139
# FLOP/byte, not 104. Solving for kv, 104 (and 204 at B = 128) both need kv ≈ 1.14 MB per
# token, so the lecture's numbers come from a different KV size than the one it states.
# With 320 KiB the B = 128 point is ≈ 397 FLOP/byte, already past the ridge of 295: on the
# lecture's own constants the inversion comes earlier (between B = 64 and B = 128 at k = 4),
# which strengthens, not weakens, the warning that speculation must back off under load.
# <!-- END ANSWER -->
# <!-- BEGIN RUBRIC -->
# Full answer: 139 (±1) at B = 32; kv ≈ 1.14 MB reproduces 104 and 204; 397 at B = 128 with
# 320 KiB, above 295, so the crossover moves to a smaller batch. Uses
# `speculative_intensity` or shows the arithmetic.
# <!-- END RUBRIC -->
