"""Beyond (specdec): the provided MTP tools beyond the 20-test contract file.

``mtp_generate`` (self-speculation) must be module 11's greedy ``generate`` whatever the head
guesses: oracles are a head that always guesses right (every guess accepted, two tokens per
pass after the first; a loop that runs the head on the last position alone, the classic slip,
loses that) and one that always guesses wrong (one token per pass). ``mtp_metrics`` is checked
against the base's own forward pass; ``train_mtp_head`` must leave the base untouched and
lower the head's loss on a learnable stream.
"""

from __future__ import annotations

import pytest
import torch
from specdec_mocks import SumModLM, windowed_greedy

from g2c.sampling import generate
from g2c.specdec import MTPHead, mtp_generate, mtp_metrics, train_mtp_head
from g2c.transformer import TransformerLM


def _tiny_lm(seed: int, *, max_seq_len: int = 48, vocab: int = 32) -> TransformerLM:
    g = torch.Generator().manual_seed(seed)
    model = TransformerLM(vocab, 16, 2, 2, max_seq_len, generator=g)
    with torch.no_grad():
        # Sharpen the near-uniform random logits so argmax gaps dwarf the float32
        # differences between passes over different block lengths.
        model.token_embed.weight.mul_(40.0)
    return model.eval()


class ChainHead(MTPHead):
    """A head that knows the base's greedy chain: row t guesses ``chain[t + 2]`` (or a wrong token).

    ``mtp_generate`` gives the head the committed history from position 0 (the tests stay
    inside the window), so row t of its input is absolute position t.
    """

    def __init__(self, base, chain: list[int], *, wrong: bool = False):
        super().__init__(base)
        self.chain, self.wrong = chain, wrong

    def forward(self, hidden, next_token_ids):
        rows = hidden.shape[1]
        logits = torch.zeros(1, rows, self.base.vocab_size, device=hidden.device)
        for t in range(rows):
            token = self.chain[t + 2] if t + 2 < len(self.chain) else 0
            if self.wrong:
                token = (token + 1) % self.base.vocab_size
            logits[0, t, token] = 1.0
        return logits


@pytest.mark.parametrize("seed, prompt, budget", [(0, [3, 14, 15, 9], 20), (1, [7], 1), (2, [1, 2, 3, 4, 5], 30)])
def test_mtp_generate_equals_greedy_generate_with_an_untrained_head(seed, prompt, budget):
    base = _tiny_lm(seed)
    head = MTPHead(base, generator=torch.Generator().manual_seed(seed + 10))
    out, stats = mtp_generate(base, head, prompt, budget)
    assert out.tolist() == generate(base, torch.tensor(prompt), budget, temperature=0.0).tolist()
    assert stats.generated == budget
    assert stats.drafted == stats.target_passes - 1                # the first pass has no guess yet
    assert stats.target_passes <= budget <= 2 * stats.target_passes


def test_mtp_generate_perfect_head_accepts_every_guess():
    base, prompt, budget = _tiny_lm(3), [5, 6, 7], 21
    chain = generate(base, torch.tensor(prompt), budget, temperature=0.0).tolist()
    out, stats = mtp_generate(base, ChainHead(base, chain), prompt, budget)
    assert out.tolist() == chain
    # Pass 1 emits one token; every later pass emits the accepted guess + the bonus token.
    assert stats.target_passes == 1 + (budget - 1) // 2 == 11
    assert stats.acceptance_rate == 1.0 and stats.accepted == 10
    assert stats.tokens_per_pass == pytest.approx(21 / 11)


def test_mtp_generate_wrong_head_still_lossless_one_token_per_pass():
    base, prompt, budget = _tiny_lm(4), [2, 9], 12
    chain = generate(base, torch.tensor(prompt), budget, temperature=0.0).tolist()
    out, stats = mtp_generate(base, ChainHead(base, chain, wrong=True), prompt, budget)
    assert out.tolist() == chain
    assert (stats.target_passes, stats.drafted, stats.accepted, stats.generated) == (12, 11, 0, 12)


def test_mtp_generate_stops_at_eos_and_respects_budget():
    base, prompt = _tiny_lm(5), [4, 4, 8]
    chain = generate(base, torch.tensor(prompt), 16, temperature=0.0).tolist()
    eos = chain[len(prompt) + 5]                                   # the 6th new token
    first = chain.index(eos, len(prompt))
    for head in (ChainHead(base, chain), ChainHead(base, chain, wrong=True)):
        out, stats = mtp_generate(base, head, prompt, 16, eos_id=eos)
        assert out.tolist() == chain[:first + 1]
        assert stats.generated == first + 1 - len(prompt)
    out, stats = mtp_generate(base, ChainHead(base, chain), prompt, 0)
    assert out.tolist() == prompt and stats.target_passes == 0


def test_mtp_generate_validates_inputs_and_restores_modes():
    base, other = _tiny_lm(6), _tiny_lm(7)
    head = MTPHead(base)
    with pytest.raises(ValueError, match="MTPHead\\(base\\)"):
        mtp_generate(base, MTPHead(other), [1, 2], 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        mtp_generate(base, head, [1, 2], -1)
    with pytest.raises(ValueError, match="prompt_ids"):
        mtp_generate(base, head, [1.5, 2.0], 4)
    with pytest.raises(ValueError, match="prompt_ids"):
        mtp_generate(base, head, [], 4)
    base.train()
    head.train()
    mtp_generate(base, head, [1, 2], 3)
    assert base.training and head.training


def test_mtp_metrics_scores_head_and_base_on_the_same_targets():
    base = _tiny_lm(8)
    head = MTPHead(base, generator=torch.Generator().manual_seed(0))
    x = torch.randint(0, base.vocab_size, (3, 10), generator=torch.Generator().manual_seed(1))
    m = mtp_metrics(base, head, x)
    with torch.no_grad():
        base_logits = base(x)[:, 1:-1]                             # rows 1..T-2 predict x[:, 2:]
        head_logits = head(base.hidden_states(x)[:, :-1], x[:, 1:])[:, :-1]
    targets = x[:, 2:]
    assert float(m["base_accuracy"]) == pytest.approx(float((base_logits.argmax(-1) == targets).float().mean()))
    assert float(m["base_loss"]) == pytest.approx(
        float(torch.nn.functional.cross_entropy(base_logits.reshape(-1, base.vocab_size), targets.reshape(-1))),
        rel=1e-5)
    assert float(m["accuracy"]) == pytest.approx(float((head_logits.argmax(-1) == targets).float().mean()))
    assert m["loss"].requires_grad


def test_train_mtp_head_learns_and_leaves_the_base_untouched():
    base = _tiny_lm(9, vocab=16)
    before = [p.detach().clone() for p in base.parameters()]
    # A stream the head can learn: token t+2 is a fixed function of token t+1.
    stream = torch.tensor([(3 * i) % 16 for i in range(2000)])
    base.train()
    head, history = train_mtp_head(base, stream, steps=40, batch_size=8, seq_len=12, lr=3e-3,
                                   generator=torch.Generator().manual_seed(0))
    assert base.training and not head.training and head.base is base
    assert all(torch.equal(a, b) for a, b in zip(before, base.parameters()))
    assert [r["step"] for r in history] == list(range(1, 41))
    assert set(history[0]) == {"step", "loss", "accuracy", "base_loss", "base_accuracy"}
    assert history[-1]["loss"] < 0.5 * history[0]["loss"]
    again, history2 = train_mtp_head(base, stream, steps=40, batch_size=8, seq_len=12, lr=3e-3,
                                     generator=torch.Generator().manual_seed(0))
    assert history2 == history                                     # seeded: reproducible


def test_train_mtp_head_rejects_bad_arguments():
    base = _tiny_lm(10)
    stream = torch.arange(100) % base.vocab_size
    with pytest.raises(ValueError, match="seq_len"):
        train_mtp_head(base, stream, steps=1, seq_len=base.max_seq_len + 1)
    with pytest.raises(ValueError, match="seq_len"):
        train_mtp_head(base, stream, steps=1, seq_len=2)
    with pytest.raises(ValueError, match="steps"):
        train_mtp_head(base, stream, steps=0, seq_len=8)
    with pytest.raises(ValueError, match="longer than seq_len"):
        train_mtp_head(base, stream[:8], steps=1, seq_len=8)


@pytest.mark.ladder
def test_mtp_generate_equals_generate_on_the_ladder():
    from g2c.assets.artifacts import load_model

    base, tok = load_model("StoryLM-1M")
    head = MTPHead(base, generator=torch.Generator().manual_seed(0))
    prompt = tok.encode("Once upon a time")
    out, stats = mtp_generate(base, head, prompt, 24, eos_id=tok.eot_id)
    assert out.tolist() == generate(base, torch.tensor(prompt), 24, temperature=0.0, eos_id=tok.eot_id).tolist()
    assert stats.generated == len(out) - len(prompt)


@pytest.mark.cpu_mock
@pytest.mark.parametrize("prompt", [[1, 2], [3, 1, 4, 1, 5, 2, 6, 5, 3, 5]])
def test_mtp_generate_equals_generate_at_the_window_edge(prompt):
    """The shared window-edge rule (``draft_room``): a guess is verified only while context +
    guess fit the window, so with a model whose next token depends on every visible id
    (``SumModLM``, window 8) the output is plain greedy decoding up to the edge and past it;
    before, the guess pass cropped one context token and the run diverged at the edge."""
    base = SumModLM(max_seq_len=8)
    head = MTPHead(base, generator=torch.Generator().manual_seed(0))
    for n in (7, 15):
        out, stats = mtp_generate(base, head, prompt, n)
        assert out.tolist() == windowed_greedy(base, prompt, n), f"{n} tokens"
        assert stats.generated == n
