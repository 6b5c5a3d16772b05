"""Beyond (specdec-serving): a small regular expression compiled to a token-level automaton. Provided.

Structured output ("answer with a date", "yes or no", a JSON field) is a constraint on the
*text*, but a language model emits *tokens*. This file turns a pattern into something a
decoding loop can use one token at a time:

1. ``parse`` reads a small regex dialect over bytes: literals, ``.``, classes ``[a-z0-9_]`` and
   ``[^...]``, the escapes ``\\d \\w \\s \\n \\t`` and escaped punctuation, groups ``( )``,
   alternation ``|`` and the quantifiers ``? * +``. A non-ASCII literal is the sequence of its
   UTF-8 bytes; classes, ``.`` and negated classes range over ASCII only (so any match stays
   valid UTF-8). The whole output must match (the pattern is anchored at both ends).
2. ``ByteDFA`` compiles it (Thompson's construction, then the subset construction) to a
   deterministic automaton over bytes, trimmed so that every state it keeps can still reach
   an accepting state: a byte that leaves the trimmed automaton can never be completed.
3. ``TokenConstraint`` lifts it to the vocabulary: from state s, token t is legal when walking
   t's bytes through the DFA stays inside it, and the state after t is where the walk ends.
   Special tokens have no bytes: only end-of-sequence is legal, and only in an accepting
   state. One rule makes literal runs cheap: where the pattern leaves exactly one byte string
   to write (a literal run, up to the next branch or accepting state), the only legal token
   is the first token of that run's canonical tokenization (``encode``: the tokenizer's own;
   without it the longest vocabulary token that is a prefix of the run), plus any token that
   writes the whole run and goes on legally (so a run ending in a space, as in ``named [A-Z]``,
   still allows the model's usual " Lily"). The constraint then
   has *forced* states, with exactly one legal continuation, and the run is written the way
   the model saw such text in training. It restricts how a literal is tokenized, never which
   texts match.

Pseudo-states: ``DONE`` (after end-of-sequence) and ``DEAD`` (after an illegal token). Both
allow end-of-sequence only, so a verify row after a rejected draft or after EOS (a row the
loop never samples from) still holds a finite logit.

Shape letters: V vocabulary, S states.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["ByteDFA", "DEAD", "DONE", "TokenConstraint", "parse", "token_bytes_of"]

DEAD = -1
DONE = -2

_DIGITS = frozenset(range(0x30, 0x3A))
_WORD = frozenset(list(range(0x30, 0x3A)) + list(range(0x41, 0x5B)) + list(range(0x61, 0x7B)) + [0x5F])
_SPACE = frozenset(b" \t\n\r\f\v")
_ASCII = frozenset(range(0x80))
_ESCAPES = {"d": _DIGITS, "w": _WORD, "s": _SPACE, "n": frozenset(b"\n"), "t": frozenset(b"\t"),
            "r": frozenset(b"\r")}
_SPECIAL = set("()|?*+[].\\")
_UNSUPPORTED = set("{}^$")


# --- 1. parsing: pattern -> tree -------------------------------------------------------------
# Nodes: ("set", frozenset of bytes) | ("cat", [nodes]) | ("alt", [nodes]) | ("star"/"plus"/"opt", node)


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.p, self.i = pattern, 0

    def fail(self, why: str) -> ValueError:
        return ValueError(f"pattern {self.p!r}: {why} at position {self.i}")

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def alt(self):
        branches = [self.cat()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.cat())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def cat(self):
        items = []
        while self.peek() is not None and self.peek() not in "|)":
            items.extend(self.repeat())
        return ("cat", items)

    def repeat(self) -> list:
        atom = self.atom()
        while self.peek() is not None and self.peek() in "?*+":
            op = {"?": "opt", "*": "star", "+": "plus"}[self.peek()]
            self.i += 1
            atom = [(op, ("cat", atom))]
        return atom

    def atom(self) -> list:
        c = self.peek()
        if c in "?*+":
            raise self.fail(f"quantifier {c!r} has nothing to repeat")
        if c in _UNSUPPORTED:
            raise self.fail(f"{c!r} is not supported (literals, ., [classes], ( | ), ?, *, + only; escape it as "
                            f"\\{c} for the character)")
        self.i += 1
        if c == "(":
            inner = self.alt()
            if self.peek() != ")":
                raise self.fail("'(' is never closed")
            self.i += 1
            return [inner]
        if c == ".":
            return [("set", _ASCII - {0x0A})]
        if c == "[":
            return [("set", self.klass())]
        if c == "\\":
            return [("set", self.escape())]
        return [("set", frozenset([b])) for b in c.encode("utf-8")]

    def escape(self) -> frozenset:
        c = self.peek()
        if c is None:
            raise self.fail("the pattern ends with a lone backslash")
        self.i += 1
        if c in _ESCAPES:
            return _ESCAPES[c]
        if c.isalnum() or ord(c) > 0x7F:
            raise self.fail(f"unknown escape \\{c}")
        return frozenset([ord(c)])

    def klass(self) -> frozenset:
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        members: set[int] = set()
        first = True
        while True:
            c = self.peek()
            if c is None:
                raise self.fail("'[' is never closed")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "\\":
                self.i += 1
                chunk = self.escape()
                members |= chunk
                continue
            if ord(c) > 0x7F:
                raise self.fail(f"non-ASCII {c!r} inside a class (write it as a literal or an alternation)")
            self.i += 1
            if self.peek() == "-" and self.i + 1 < len(self.p) and self.p[self.i + 1] != "]":
                hi = self.p[self.i + 1]
                if ord(hi) > 0x7F or ord(hi) < ord(c):
                    raise self.fail(f"bad range {c}-{hi}")
                self.i += 2
                members |= set(range(ord(c), ord(hi) + 1))
            else:
                members.add(ord(c))
        out = (_ASCII - members) if negate else frozenset(members)
        if not out:
            raise self.fail("the class matches nothing")
        return frozenset(out)


def parse(pattern: str):
    """Parse ``pattern`` (a str in the dialect above) into a tree of nodes.

    Raises:
        TypeError: pattern is not a str.
        ValueError: unbalanced parentheses or brackets, a quantifier with nothing to repeat, an
            unknown escape, a bad or empty class, unsupported syntax (``{m,n}``, ``^``, ``$``);
            the message names the pattern and the position.
    """
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
    parser = _Parser(pattern)
    tree = parser.alt()
    if parser.peek() is not None:                      # only a stray ')' stops alt() early
        raise parser.fail("unbalanced ')'")
    return tree


# --- 2. Thompson NFA -> subset construction -> trimmed byte DFA -------------------------------


class _NFA:
    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[frozenset, int]]] = []

    def new(self) -> int:
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node) -> tuple[int, int]:
        kind = node[0]
        s, e = self.new(), self.new()
        if kind == "set":
            self.edges[s].append((node[1], e))
        elif kind == "cat":
            cur = s
            for child in node[1]:
                a, b = self.build(child)
                self.eps[cur].append(a)
                cur = b
            self.eps[cur].append(e)
        elif kind == "alt":
            for child in node[1]:
                a, b = self.build(child)
                self.eps[s].append(a)
                self.eps[b].append(e)
        else:                                              # opt / star / plus
            a, b = self.build(node[1])
            self.eps[s].append(a)
            self.eps[b].append(e)
            if kind in ("opt", "star"):
                self.eps[s].append(e)
            if kind in ("star", "plus"):
                self.eps[b].append(a)
        return s, e

    def closure(self, states) -> frozenset:
        out, todo = set(states), list(states)
        while todo:
            for t in self.eps[todo.pop()]:
                if t not in out:
                    out.add(t)
                    todo.append(t)
        return frozenset(out)


@dataclass
class ByteDFA:
    """A deterministic automaton over bytes: state 0 is the start.

    Attributes:
        moves: per state, a dict byte -> next state (a missing byte leaves the language).
        accepting: per state, True where the bytes read so far are a whole match.
    """

    moves: list[dict[int, int]]
    accepting: list[bool]

    @classmethod
    def compile(cls, pattern: str) -> "ByteDFA":
        """Compile a pattern (see ``parse``); raises as ``parse``, and ValueError when the pattern
        matches nothing at all."""
        nfa = _NFA()
        start, final = nfa.build(parse(pattern))
        first = nfa.closure([start])
        index, sets, moves = {first: 0}, [first], [{}]
        i = 0
        while i < len(sets):
            by_byte: dict[int, set[int]] = {}
            for s in sets[i]:
                for chars, t in nfa.edges[s]:
                    for b in chars:
                        by_byte.setdefault(b, set()).add(t)
            for b, targets in by_byte.items():
                nxt = nfa.closure(targets)
                if nxt not in index:
                    index[nxt] = len(sets)
                    sets.append(nxt)
                    moves.append({})
                moves[i][b] = index[nxt]
            i += 1
        accepting = [final in s for s in sets]
        live = {i for i, a in enumerate(accepting) if a}           # trim: keep states that reach a match
        changed = True
        while changed:
            changed = False
            for i, m in enumerate(moves):
                if i not in live and any(t in live for t in m.values()):
                    live.add(i)
                    changed = True
        if 0 not in live:
            raise ValueError(f"pattern {pattern!r} matches no text at all")
        order = sorted(live)                                         # renumber, start stays 0
        new = {old: j for j, old in enumerate(order)}
        return cls(moves=[{b: new[t] for b, t in moves[old].items() if t in live} for old in order],
                   accepting=[accepting[old] for old in order])

    def walk(self, state: int, data: bytes) -> int:
        """The state after reading ``data`` from ``state``, or ``DEAD``."""
        for b in data:
            state = self.moves[state].get(b, DEAD)
            if state == DEAD:
                return DEAD
        return state

    def forced_bytes(self, state: int) -> bytes:
        """The byte string the pattern forces from ``state``: bytes while the state is not
        accepting and has exactly one way on (empty when the state branches or accepts)."""
        out = bytearray()
        while not self.accepting[state] and len(self.moves[state]) == 1 and len(out) < 4096:
            (b, state), = self.moves[state].items()
            out.append(b)
        return bytes(out)

    def matches(self, data: bytes) -> bool:
        """True when ``data`` (bytes) is a whole match."""
        s = self.walk(0, data)
        return s != DEAD and self.accepting[s]


def token_bytes_of(tokenizer) -> list[bytes | None]:
    """Per id, the bytes a course ``BPETokenizer`` token stands for (None for special tokens)."""
    specials = set(tokenizer.special_tokens)
    out: list[bytes | None] = []
    for i in range(tokenizer.vocab_size):
        s = tokenizer.inverse[i]
        out.append(None if s in specials else bytes(tokenizer.byte_decoder[c] for c in s))
    return out


class TokenConstraint:
    """A regex as a token-level state machine over one vocabulary.

    Args:
        pattern: the regex (dialect of ``parse``); the whole output must match it.
        token_bytes: per id in [0, V), the token's bytes, or None for a special token.
        eos_id: the end-of-sequence id in [0, V): legal exactly in accepting states.
        encode: optional ``encode(text) -> list[int]`` (the tokenizer's) for the canonical
            tokenization of literal runs; None uses the longest matching token.

    Build it from a course tokenizer with ``TokenConstraint.from_tokenizer(pattern, tok)``.

    States are ints: 0 the start, ``DONE`` after EOS, ``DEAD`` after an illegal token.
    ``mask(state)`` is a (V,) bool tensor on the CPU (cached per state), ``step(state, token)``
    the next state, ``forced(state)`` the one legal token or None.

    Raises:
        TypeError: pattern not a str; token_bytes not a sequence of bytes/None; eos_id not an
            int; encode not callable.
        ValueError: as ``parse`` (the message names the pattern); a pattern that matches no text;
            V < 1; eos_id outside [0, V) or an ordinary token ("is an ordinary token"); a vocabulary
            in which some state of the pattern has no legal token (the vocabulary lacks a byte the
            pattern needs; every state is checked here).
    """

    def __init__(self, pattern: str, token_bytes: Sequence[bytes | None], eos_id: int, *,
                 encode: Callable[[str], list[int]] | None = None) -> None:
        if isinstance(token_bytes, (str, bytes)) or not isinstance(token_bytes, Iterable):
            raise TypeError(f"token_bytes must be a sequence of bytes or None per id, got {type(token_bytes).__name__}"
                            " (use token_bytes_of(tokenizer) or TokenConstraint.from_tokenizer)")
        token_bytes = list(token_bytes)
        if not token_bytes:
            raise ValueError("token_bytes is empty: the vocabulary needs at least one token")
        for t in token_bytes:
            if t is not None and not isinstance(t, bytes):
                raise TypeError(f"token_bytes must hold bytes or None, got {type(t).__name__}")
        if encode is not None and not callable(encode):
            raise TypeError(f"encode must be callable or None, got {type(encode).__name__}")
        try:                                # ints, NumPy ints, 0-d integer tensors; never a bool or a float
            if isinstance(eos_id, bool):
                raise TypeError
            eos_id = operator.index(eos_id)
        except TypeError:
            raise TypeError(f"eos_id must be an int id in [0, {len(token_bytes)}), got {type(eos_id).__name__} "
                            f"{eos_id!r}: a constraint needs end-of-sequence to finish") from None
        if not 0 <= eos_id < len(token_bytes):
            raise ValueError(f"eos_id must be an int id in [0, {len(token_bytes)}), got {eos_id!r}: a constraint "
                             f"needs end-of-sequence to finish")
        if token_bytes[eos_id]:             # an ordinary token would end every text that writes it
            raise ValueError(f"eos_id {eos_id} is an ordinary token (its bytes {token_bytes[eos_id]!r}): give the "
                             "tokenizer's end-of-sequence id, a special token without bytes")
        self.pattern = pattern
        self.dfa = ByteDFA.compile(pattern)
        self.token_bytes = token_bytes
        self.vocab_size = len(token_bytes)
        self.eos_id = eos_id
        self.encode = encode
        self._by_bytes: dict[bytes, int] = {}
        for i, t in enumerate(token_bytes):
            if t:
                self._by_bytes.setdefault(t, i)
        self._next: dict[int, dict[int, int]] = {}        # state -> {token: next state}
        self._mask: dict[int, torch.Tensor] = {}
        for state in range(len(self.dfa.accepting)):      # every state now (a vocabulary of 4096 tokens: ~30 ms),
            self.transitions(state)                       # so a byte the vocabulary lacks is named here, not mid-loop

    @classmethod
    def from_tokenizer(cls, pattern: str, tokenizer, *, eos_id: int | None = None) -> "TokenConstraint":
        """From a course ``BPETokenizer``: its tokens' bytes, its ``encode``, and its
        ``<|endoftext|>`` as end-of-sequence unless ``eos_id`` is given."""
        eos = tokenizer.eot_id if eos_id is None else eos_id
        if eos is None:
            raise ValueError("the tokenizer has no <|endoftext|>: pass eos_id")
        return cls(pattern, token_bytes_of(tokenizer), eos, encode=tokenizer.encode)

    def __repr__(self) -> str:
        return f"TokenConstraint({self.pattern!r}, V={self.vocab_size}, eos_id={self.eos_id})"

    @property
    def start(self) -> int:
        return 0

    def accepting(self, state: int) -> bool:
        """True in an accepting DFA state (EOS legal there); False for DONE/DEAD."""
        return state >= 0 and self.dfa.accepting[state]

    def _canonical(self, run: bytes) -> int:
        if self.encode is not None:
            n = len(run)
            while n > 0:
                try:
                    text = run[:n].decode("utf-8")
                    break
                except UnicodeDecodeError:
                    n -= 1
            if n > 0:
                ids = self.encode(text)
                if ids and ids[0] < self.vocab_size and self.token_bytes[ids[0]] and \
                        run.startswith(self.token_bytes[ids[0]]):
                    return ids[0]
        for n in range(len(run), 0, -1):                   # longest token that is a prefix of the run
            if run[:n] in self._by_bytes:
                return self._by_bytes[run[:n]]
        raise ValueError(f"the vocabulary has no token for byte {run[0]:#04x}, which pattern {self.pattern!r} needs")

    def transitions(self, state: int) -> dict[int, int]:
        """{token: next state} for every legal non-EOS token from a DFA state (cached)."""
        if state < 0:
            return {}
        if state not in self._next:
            run = self.dfa.forced_bytes(state)
            if run:
                tok = self._canonical(run)
                nxt = {tok: self.dfa.walk(state, self.token_bytes[tok])}
                for i, t in enumerate(self.token_bytes):       # tokens that finish the run and go on
                    if t and len(t) > len(run) and t.startswith(run):
                        s = self.dfa.walk(state, t)
                        if s != DEAD:
                            nxt[i] = s
            else:
                nxt = {}
                for i, t in enumerate(self.token_bytes):
                    if t:
                        s = self.dfa.walk(state, t)
                        if s != DEAD:
                            nxt[i] = s
            if not nxt and not self.dfa.accepting[state]:
                raise ValueError(f"pattern {self.pattern!r}: no token of this vocabulary continues state {state}")
            self._next[state] = nxt
        return self._next[state]

    def mask(self, state: int) -> torch.Tensor:
        """(V,) bool on the CPU: the legal next tokens in ``state``. DONE and DEAD allow EOS only."""
        if state not in self._mask:
            m = torch.zeros(self.vocab_size, dtype=torch.bool)
            if state >= 0:
                nxt = self.transitions(state)
                if nxt:
                    m[torch.tensor(list(nxt), dtype=torch.long)] = True
                if self.dfa.accepting[state]:
                    m[self.eos_id] = True
            else:
                m[self.eos_id] = True
            self._mask[state] = m
        return self._mask[state]

    def step(self, state: int, token: int) -> int:
        """The state after ``token``: DONE after EOS in an accepting state, DEAD after an
        illegal token (and from DONE/DEAD)."""
        if state < 0:
            return DEAD
        if token == self.eos_id:
            return DONE if self.dfa.accepting[state] else DEAD
        return self.transitions(state).get(int(token), DEAD)

    def walk(self, state: int, tokens) -> int:
        """The state after a sequence of tokens (ints, a list or a 1-D tensor)."""
        for t in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens):
            state = self.step(state, int(t))
        return state

    def forced(self, state: int) -> int | None:
        """The one legal token of ``state`` (EOS in an accepting state with no way on), or None."""
        if state < 0:
            return None
        nxt = self.transitions(state)
        acc = self.dfa.accepting[state]
        if len(nxt) == 1 and not acc:
            return next(iter(nxt))
        if not nxt and acc:
            return self.eos_id
        return None
