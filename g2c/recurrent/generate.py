"""Beyond (specdec-state): speculative decoding over a stateful target, and its reference.

``speculative_generate_stateful`` is the specdec module's greedy loop with one change: the
target is never rerun over the whole prefix. Its state lives in a ``StateTransaction``;
each round opens the transaction, advances it over [last emitted token, k drafts], lets
``g2c.specdec.greedy_verify`` pick the accepted prefix, and commits exactly the accepted
boundary. It has no round of its own: the transaction is a ``Target`` of the engine
(``TransactionTarget``), the drafter callable an engine drafter (``FunctionDrafter``), and
the round is specdec-sampling's ``speculative_sample`` at temperature 0. ``plain_greedy`` is
ordinary decoding, one token per pass: the reference the speculative loop must match in
tokens and in state.

Shape letters: T time, V vocabulary, k draft length. No exercise in this file.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from g2c.sampling.generate import as_token_ids
from g2c.sampling.model import check_count, check_score_rows, eval_mode
from g2c.specdec import SpecStats, draft_greedy
from g2c.specdec.sampling.draft import Draft
from g2c.specdec.sampling.drafters import Drafter
from g2c.specdec.sampling.loop import speculative_sample
from g2c.specdec.sampling.target import Target, chain_only

from .model import DecodeState, RecurrentLM
from .recompute import RecomputeTransaction
from .replay import ReplayTransaction
from .snapshot import SnapshotTransaction
from .transaction import StateCosts, StateTransaction

__all__ = ["FunctionDrafter", "TransactionTarget", "greedy_drafter", "make_transaction", "plain_greedy",
           "speculative_generate_stateful"]

_STRATEGIES = {"snapshot": SnapshotTransaction, "replay": ReplayTransaction, "recompute": RecomputeTransaction}


ENGINE_CONTROLS = frozenset({"repetition_penalty", "stop_ids", "stop_strings", "decode", "logprobs", "temperature",
                             "top_k", "top_p", "generator"})


def make_transaction(model: RecurrentLM, strategy: str, **kwargs) -> StateTransaction:
    """Build the transaction named ``strategy`` ("snapshot", "replay" or "recompute") on ``model``.

    Raises:
        TypeError: strategy not a string.
        ValueError: an unknown strategy name (the message lists the valid names).
    """
    if not isinstance(strategy, str) or strategy not in _STRATEGIES:                 # a wrong type: TypeError
        raise (ValueError if isinstance(strategy, str) else TypeError)(
            f"unknown state strategy {strategy!r}; choose one of {', '.join(_STRATEGIES)}")
    return _STRATEGIES[strategy](model, **kwargs)

DraftFn = Callable[[torch.Tensor, int], torch.Tensor]      # a drafter callable (ctx, k) -> k ids


def greedy_drafter(model) -> DraftFn:
    """A drafter callable ``(context (N,) int64, k) -> (k,) int64`` from any model that
    ``g2c.specdec.draft_greedy`` accepts (ids (1, T) -> logits, ``max_seq_len``, ``device``)."""
    return lambda ctx, k: draft_greedy(model, ctx, k)


def _check_budget(model: RecurrentLM, num_prompt: int, max_new_tokens: int) -> None:
    max_new_tokens = check_count(max_new_tokens, "max_new_tokens")
    if model.attention_layers and num_prompt + max_new_tokens > model.max_seq_len + 1:
        raise ValueError(f"prompt ({num_prompt}) + max_new_tokens ({max_new_tokens}) exceeds the attention "
                         f"layers' max_seq_len={model.max_seq_len} + 1 (the last token's context must fit; a "
                         "recurrent state cannot slide a window); generate fewer tokens")


class TransactionTarget(Target):
    """A recurrent (or hybrid) target whose state lives in a ``StateTransaction``. Provided.

    ``start`` prefills every prompt token but the pending last one (its costs move to
    ``txn.prefill_costs``, so ``txn.costs`` counts the rounds only); ``score`` opens the
    transaction and advances it over [pending token, drafts] (k'+1 rows); ``commit`` commits
    exactly the positions that precede the last emitted token (``txn.commit(len(emitted) - 1)``)
    and calls ``on_round(txn, ids)``. A pure recurrent layout has no window: its
    ``max_seq_len`` is unbounded for ``draft_room`` (``visible`` is 0); with attention layers
    the window is the model's ``max_seq_len`` (the caller keeps prompt + budget within
    ``max_seq_len + 1``: a recurrent state cannot slide a window).

    Args:
        txn: a fresh ``StateTransaction`` on its model (``g2c.recurrent.make_transaction``).
        on_round: ``on_round(txn, ids)`` after each committed round.
    """

    def __init__(self, txn, *, on_round: Callable | None = None) -> None:
        self.txn = txn
        self.model = txn.model
        self.on_round = on_round
        self._length = 0

    @property
    def max_seq_len(self) -> int:
        return self.model.max_seq_len if self.model.attention_layers else sys.maxsize

    def start(self, prompt_ids: torch.Tensor) -> None:
        if prompt_ids.numel() > 1:
            self.txn.prefill(prompt_ids[:-1])
        self.txn.prefill_costs, self.txn.costs = self.txn.costs, StateCosts()      # count the rounds only

    def visible(self, context_ids: torch.Tensor) -> int:
        return len(context_ids) if self.model.attention_layers else 0

    def score(self, context_ids: torch.Tensor, draft):
        draft_ids = chain_only(draft, self)
        self._length = len(context_ids)
        self.txn.begin()
        return self.txn.advance(torch.cat([context_ids[-1:], draft_ids])), None    # (k'+1, V)

    def commit(self, context_ids: torch.Tensor, num_accepted: int) -> None:
        self.txn.commit(len(context_ids) - self._length - 1)
        if self.on_round is not None:
            self.on_round(self.txn, context_ids)


class FunctionDrafter(Drafter):
    """A drafter callable ``(context (N,) int64 CPU, k) -> (k,) ids`` as an engine drafter. Provided.

    Deterministic proposals (q one-hot); ``propose`` refuses a callable that returns another
    number of ids than asked ("draft returned ... tokens for k=...").
    """

    def __init__(self, draft: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
        self.draft = draft

    def propose(self, context_ids: torch.Tensor, k: int) -> Draft:
        proposal = torch.as_tensor(self.draft(context_ids, k)).long().cpu().view(-1)
        if proposal.numel() != k:
            raise ValueError(f"draft returned {proposal.numel()} tokens for k={k}; it must return exactly k ids")
        return Draft(proposal)


@torch.no_grad()
def plain_greedy(model: RecurrentLM, prompt_ids, max_new_tokens: int, *,
                 on_token: Callable[[DecodeState, torch.Tensor], None] | None = None) -> torch.Tensor:
    """Greedy decoding one token per pass (the recurrent form), the reference.

    Args:
        model: a ``RecurrentLM``.
        prompt_ids: 1-D int tensor or list, length >= 1.
        max_new_tokens: >= 0.
        on_token: optional ``on_token(state, ids)`` after each new token, with the
            ``DecodeState`` holding every token but the newest (not yet fed) and ids so far.

    Returns:
        LongTensor (N,) on the CPU: the prompt and the new tokens.

    Raises:
        ValueError: an empty prompt, max_new_tokens < 0, or (with attention layers) prompt +
            budget beyond ``max_seq_len + 1``: the newest token is never fed, so the last
            token's context fills the window at most; a recurrent state summarises the whole
            history and has no sliding window, so longer runs are refused.
    """
    ids = as_token_ids(prompt_ids, "prompt_ids", vocab_size=model.vocab_size)
    _check_budget(model, ids.numel(), max_new_tokens)
    with eval_mode(model):
        state = DecodeState(model)
        logits = state.feed(ids)[-1]
        for step in range(max_new_tokens):
            check_score_rows(logits, "logits", where=f"plain_greedy, the step scoring position {ids.numel()}")
            ids = torch.cat([ids, logits.argmax().cpu().view(1)])
            if on_token is not None:
                on_token(state, ids)
            if step < max_new_tokens - 1:                    # the newest token is fed only when needed
                logits = state.feed(ids[-1:])[-1]
    return ids


@torch.no_grad()
def speculative_generate_stateful(target: RecurrentLM, draft: DraftFn, prompt_ids, max_new_tokens: int, *,
                                  k: int = 4, strategy: str | StateTransaction = "replay",
                                  eos_id: int | None = None,
                                  on_round: Callable[[StateTransaction, torch.Tensor], None] | None = None,
                                  **strategy_kwargs) -> tuple[torch.Tensor, SpecStats, StateTransaction]:
    """Greedy speculative decoding with the target's state committed by a transaction.

    Each round: draft k_step = ``g2c.specdec.draft_room(min(k, remaining budget), len(ids),
    max_seq_len)`` tokens (the window-edge rule every loop shares; only with attention
    layers, a pure recurrent layout has no window); at k_step = 0 the round is a plain step
    (the pending token alone, no draft); ``txn.begin()``;
    ``txn.advance([last emitted] + draft)`` gives the k_step + 1 verification rows;
    ``greedy_verify``; cut the emitted tokens to the budget and after ``eos_id``; commit
    the positions that precede the last emitted token (``commit(len(emitted) - 1)``). The
    last emitted token is fed at the start of the next round.

    Args:
        target: a ``RecurrentLM`` (recurrent or hybrid layout).
        draft: ``(context (N,) int64 CPU, k) -> (k,) int64`` proposals (``greedy_drafter(model)``,
            or any function: only the work changes, never the output).
        prompt_ids: 1-D int tensor or list, length >= 1.
        max_new_tokens: budget >= 0, never exceeded.
        k: draft length per round, an int >= 1.
        strategy: "snapshot", "replay", "recompute", or a fresh ``StateTransaction`` on ``target``.
        eos_id: stop right after emitting this id.
            None, or an id in [0, V) (``check_eos_id``: ValueError outside it, TypeError for a non-int).
        on_round: optional ``on_round(txn, ids)`` after each committed round; then
            ``txn.committed_state()`` is the state after ``ids[:-1]``.
        **strategy_kwargs: passed to the transaction (e.g. ``capacity=`` for replay).

    Returns:
        (ids, stats, txn): ids (N,) int64 on the CPU, equal to ``plain_greedy(target,
        prompt_ids, max_new_tokens)`` (cut after eos_id); ``SpecStats`` with one record per
        round; the transaction, whose ``costs`` hold the state accounting of the speculative
        rounds (the prompt's prefill is in ``txn.prefill_costs``).

    Raises:
        TypeError: one of the engine's sampling controls (``repetition_penalty``, ``stop_ids``,
            ``stop_strings``, ``decode``, ``logprobs``, ``temperature``, ``top_k``, ``top_p``,
            ``generator``) among the keyword arguments: this preset is greedy and its keyword
            arguments go to the transaction; the message names the call that takes them
            (``speculative_sample`` with a ``TransactionTarget``).
        ValueError: bad prompt, k or budget (messages name "prompt_ids", "k",
            "max_new_tokens" or "max_seq_len"; prompt + budget may be at most max_seq_len + 1
            with attention layers, as ``plain_greedy``); a draft that is not k token ids ("draft");
            an unknown strategy name; a transaction built on another model or already used
            ("strategy: ..."): a transaction serves one generation on its own model.
    """
    _check_strategy(target, strategy, strategy_kwargs)
    ids = as_token_ids(prompt_ids, "prompt_ids", vocab_size=target.vocab_size)   # its length: the budget rule
    _check_budget(target, ids.numel(), max_new_tokens)              # the engine checks k and eos_id
    txn = strategy if isinstance(strategy, StateTransaction) else make_transaction(target, strategy, **strategy_kwargs)
    # the preset: the engine with the transaction as target and the callable as drafter, greedy
    ids, stats = speculative_sample(TransactionTarget(txn, on_round=on_round), FunctionDrafter(draft), ids,
                                    max_new_tokens, k=k, temperature=0.0, eos_id=eos_id)
    return ids, stats, txn


def _check_strategy(target, strategy, strategy_kwargs: dict) -> None:
    """``speculative_generate_stateful``'s own arguments: no engine controls among the transaction's
    keywords (the message names the call that takes them), and a ``StateTransaction`` passed as the
    strategy built on ``target`` and unused."""
    controls = sorted(set(strategy_kwargs) & ENGINE_CONTROLS)
    if controls:                       # not the transaction's: say which call takes them
        raise TypeError(f"speculative_generate_stateful is the greedy preset and takes no sampling controls "
                        f"({', '.join(controls)}); the engine takes them: speculative_sample(TransactionTarget("
                        "make_transaction(target, 'replay')), FunctionDrafter(draft), prompt_ids, max_new_tokens, "
                        f"{controls[0]}=...)")
    if isinstance(strategy, StateTransaction):
        if strategy.model is not target:
            raise ValueError(f"strategy: this {strategy.name} transaction was built on another model, not on target; "
                             "build one with make_transaction(target, ...) or pass the strategy's name")
        if strategy.length != 0 or strategy._open or strategy.costs.model_passes:
            raise ValueError(f"strategy: this {strategy.name} transaction was used already (it holds "
                             f"{strategy.length} committed positions of an earlier run); a transaction serves one "
                             "generation: build a fresh one with make_transaction(target, ...)")
