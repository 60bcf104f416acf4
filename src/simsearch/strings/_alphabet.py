"""Input validation and integer coding of strings over a fixed alphabet, shared by the encoders
and the string index."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidParameterError, InvalidVectorError

MAX_ALPHABET = 255  # codes are uint8 with 0 reserved for padding


class InvalidStringError(InvalidVectorError, TypeError):
    """Input that is not a list of ``str`` (e.g. bytes, numbers, None)."""


class UnknownCharacterError(InvalidVectorError):
    """Strings holding characters outside the encoder's fixed alphabet."""


def check_strings(strings: Any, what: str = "strings", allow_empty: bool = False) -> list[str]:
    """A non-empty list of ``str``; a single ``str`` is refused (it would be read as characters)."""
    if isinstance(strings, (str, bytes)):
        raise InvalidStringError(
            f"{what} must be a list of str; got a single {type(strings).__name__} "
            f"(wrap it in a list)"
        )
    if isinstance(strings, np.ndarray):
        strings = strings.tolist()
    if not isinstance(strings, Sequence):
        try:
            strings = list(strings)
        except TypeError:
            raise InvalidStringError(
                f"{what} must be a list of str; got {type(strings).__name__}"
            ) from None
    if not allow_empty and len(strings) == 0:
        raise InvalidParameterError(f"{what} must hold at least one string; got an empty list")
    for i, s in enumerate(strings):
        if not isinstance(s, str):
            raise InvalidStringError(
                f"{what} must all be str; item {i} is {type(s).__name__} ({s!r:.40})"
            )
    return list(strings)


def string_batch(x: Any, what: str = "strings") -> np.ndarray:
    """A batch of strings as a 1-d object array: a str is one item, else a list (or array) of
    str, possibly empty."""
    texts = [x] if isinstance(x, str) else check_strings(x, what, allow_empty=True)
    out = np.empty(len(texts), object)
    out[:] = texts
    return out


class Alphabet:
    """A fixed, sorted set of characters; character i is coded i + 1 (0 pads).

    >>> from simsearch.strings import Alphabet
    >>> a = Alphabet("tgca")
    >>> a.chars
    'acgt'
    >>> codes, lengths = a.encode(["gat", "c"], 4)   # code i + 1, 0 pads to max_len
    >>> codes.tolist(), lengths.tolist()
    ([[3, 1, 4, 0], [2, 0, 0, 0]], [3, 1])
    """

    def __init__(self, chars: str | Sequence[str]):
        chars = sorted(set(chars))
        if not chars or any(len(c) != 1 for c in chars):
            raise InvalidParameterError(
                f"alphabet must be a non-empty set of single characters; got {chars!r:.80}"
            )
        if len(chars) > MAX_ALPHABET:
            raise InvalidParameterError(
                f"alphabet must hold at most {MAX_ALPHABET} characters; got {len(chars)}"
            )
        self.chars = "".join(chars)
        self._cps = np.array([ord(c) for c in chars], dtype=np.uint32)

    @classmethod
    def from_strings(cls, strings: list[str]) -> Alphabet:
        chars = set().union(*map(set, strings)) if strings else set()
        if not chars:
            raise InvalidParameterError("cannot learn an alphabet: every string is empty")
        return cls(chars)

    def __len__(self) -> int:
        return len(self.chars)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Alphabet) and other.chars == self.chars

    def __repr__(self) -> str:
        return f"Alphabet({self.chars!r})"

    def encode(self, strings: list[str], max_len: int, what: str = "strings"):
        """Codes uint8 (n, max_len), 0-padded and truncated to ``max_len``, and the truncated
        lengths int64 (n,). Raises UnknownCharacterError for characters outside the alphabet."""
        n = len(strings)
        lengths = np.fromiter((len(s) for s in strings), dtype=np.int64, count=n)
        cps = np.frombuffer("".join(strings).encode("utf-32-le"), dtype=np.uint32)
        pos = np.searchsorted(self._cps, cps)
        pos_c = np.minimum(pos, len(self._cps) - 1)
        bad = self._cps[pos_c] != cps
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            row = int(np.searchsorted(np.cumsum(lengths), first, side="right"))
            unknown = sorted({chr(c) for c in cps[bad][:1000]})
            raise UnknownCharacterError(
                f"{what} hold {int(bad.sum())} character(s) outside the alphabet, e.g. "
                f"{''.join(unknown[:10])!r} in item {row} ({strings[row]!r:.40}); allowed: "
                f"{self.chars!r:.120}"
            )
        codes = np.zeros((n, max_len), np.uint8)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        within = np.arange(cps.size, dtype=np.int64) - np.repeat(starts, lengths)
        keep = within < max_len
        rows = np.repeat(np.arange(n), lengths)
        codes[rows[keep], within[keep]] = (pos_c[keep] + 1).astype(np.uint8)
        return codes, np.minimum(lengths, max_len)
