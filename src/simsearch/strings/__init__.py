"""CNN-ED: convolutional edit-distance embeddings and string search (docs/bench/strings.md).

    enc = CNNEDEncoder(max_len=32).fit(train_strings)       # torch is imported here, lazily
    idx = StringIndex(encoder=enc, index="hnsw", M=16)       # kind "strings", metric "edit"
    idx.add(base)
    ids, dists = idx.search(queries, k=10, n_candidates=1024)

Also the CGK embedding baseline (:class:`CGKEncoder`, :func:`hamming_search`) and the exact
reference (:func:`brute_force_search`). Needs the ``strings`` extra (torch, rapidfuzz).
"""

from ._alphabet import Alphabet, InvalidStringError, UnknownCharacterError, string_batch
from .brute import brute_force_search, edit_distance_matrix
from .cgk import CGKEncoder, hamming_search
from .encoder import CNNEDEncoder
from .string_index import StringIndex

__all__ = [
    "Alphabet",
    "CGKEncoder",
    "CNNEDEncoder",
    "InvalidStringError",
    "StringIndex",
    "UnknownCharacterError",
    "brute_force_search",
    "edit_distance_matrix",
    "hamming_search",
    "string_batch",
]
