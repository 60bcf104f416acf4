"""The CNN-ED network (torch). Imported only when an encoder is built, so ``import simsearch``
never loads torch."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn


def default_n_layers(max_len: int) -> int:
    """Depth that follows the maximum length: pool until about 16 positions are left, so words
    (max_len 32) get one layer and strings of 1,024 get six; at least 1, at most 12."""
    return int(min(12, max(1, math.ceil(math.log2(max(max_len, 2))) - 4)))


class CNNEDNet(nn.Module):
    """One-hot (N, C, M) -> embedding (N, embed_dim).

    [Conv1d(kernel 3) -> ReLU -> pool 2] x n_layers, flatten, one linear layer to the embedding.
    Shallow stacks (n_layers <= 2, words) follow the paper's layout: every character's indicator
    row is a separate one-channel signal, all rows share the convolutions, max pooling; the
    flattened size is C * channels * M / 2^n_layers. Deep stacks (long strings) take the C
    indicator rows as input channels of the first convolution and use average pooling (which
    keeps long-range counts): the per-row layout costs C times more and was measured at
    17 ms per string of length 512 here, too slow to embed 50,000 proteins. With
    ``global_channels`` > 0, a kernel-2 convolution on the one-hot input, ReLU and a mean over
    all positions add that many whole-string features before the linear layer.

    With ``profile`` (a deviation from the paper, for long strings), the square roots of the
    string's letter and letter-pair counts (``C + 1 + (C + 1)^2`` features) pass through a second
    linear map that is added to the embedding. :meth:`init_profile` starts it as a scaled random
    projection with the convolutional path's output at zero, so training starts from the
    profile's ranking (measured on proteins: recall@10 0.64 at T = 1,000 after a 128-d random
    projection, against 0.48 for CGK) and refines it; the map is learned, so it can weigh letter
    pairs as edit distance does.
    """

    def __init__(self, n_chars: int, max_len: int, embed_dim: int, n_layers: int, channels: int,
                 global_channels: int = 0, profile: bool = False):
        super().__init__()
        self.n_chars, self.n_layers = n_chars, n_layers
        step = 1 << n_layers
        self.padded_len = -(-max_len // step) * step  # each pooling halves: pad to a multiple
        self.per_char = n_layers <= 2
        pool = nn.MaxPool1d if self.per_char else nn.AvgPool1d
        layers: list[nn.Module] = []
        in_ch = 1 if self.per_char else n_chars
        for _ in range(n_layers):
            layers += [nn.Conv1d(in_ch, channels, 3, padding=1, bias=False), nn.ReLU(), pool(2)]
            in_ch = channels
        self.conv = nn.Sequential(*layers)
        rows = n_chars if self.per_char else 1
        self.flat_size = rows * channels * (self.padded_len // step)
        # Global branch: bigram detectors averaged over the whole (padded) string, i.e. learned
        # composition counts scaled by length. Far neighbours of long strings are decided by
        # length and composition, which the positional stack only sees bin by bin.
        self.global_channels = global_channels
        self.glob = (nn.Conv1d(n_chars, global_channels, 2, bias=False)
                     if global_channels else None)
        self.fc = nn.Linear(self.flat_size + global_channels, embed_dim)
        self.stride = n_chars + 1  # code 0 pads
        self.prof = (nn.Linear(self.stride + self.stride**2, embed_dim, bias=False)
                     if profile else None)

    def inputs(self, codes: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The network's inputs from uint8 codes (N, M): the one-hot and, with ``profile``,
        the profile features."""
        return self.one_hot(codes), (self.profile_features(codes) if self.prof is not None
                                     else None)

    def profile_features(self, codes: np.ndarray) -> torch.Tensor:
        """sqrt of the letter counts and letter-pair counts float32 (N, stride + stride^2);
        the pad code's entries stay 0. (sqrt: measured recall@10 0.74 at T = 1,000 on proteins
        by L2, against 0.73 with plain counts.)"""
        c = torch.from_numpy(codes.astype(np.int64))
        n = c.shape[0]
        uni = torch.zeros(n, self.stride).scatter_add_(1, c, torch.ones(c.shape))
        uni[:, 0] = 0.0
        pair = c[:, :-1] * self.stride + c[:, 1:]
        real = (c[:, 1:] > 0).float()  # padding only follows the string
        bi = torch.zeros(n, self.stride**2).scatter_add_(1, pair, real)
        return torch.cat([uni, bi], 1).sqrt_()

    @torch.no_grad()
    def init_profile(self, features: torch.Tensor, seed: int) -> None:
        """Random Gaussian projection scaled so that random pairs of ``features`` rows lie at
        mean distance 1 (the training scale: edit distance / its mean), and the convolutional
        path's output set to zero, so that at first the embedding is the projected profile."""
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(self.prof.weight.shape, generator=g)
        n = features.shape[0]
        i = torch.randperm(n, generator=g)
        diff = (features - features[i]) @ w.T
        dist = diff.norm(dim=1)[i != torch.arange(n)].mean().clamp_min(1e-6)
        self.prof.weight.copy_(w / dist)
        self.fc.weight.zero_()
        self.fc.bias.zero_()

    def one_hot(self, codes: np.ndarray) -> torch.Tensor:
        """uint8 codes (N, M), 0 = padding -> float32 one-hot (N, C, padded_len)."""
        n, m = codes.shape
        x = np.zeros((n, self.n_chars, self.padded_len), np.float32)
        rows, cols = np.nonzero(codes)
        x[rows, codes[rows, cols].astype(np.int64) - 1, cols] = 1.0  # numpy: 5x F.one_hot here
        return torch.from_numpy(x)

    def forward(self, x: torch.Tensor, profile: torch.Tensor | None = None) -> torch.Tensor:
        n, c, m = x.shape
        h = self.conv(x.reshape(n * c, 1, m) if self.per_char else x).reshape(n, self.flat_size)
        if self.glob is not None:
            h = torch.cat([h, torch.relu(self.glob(x)).mean(2)], 1)
        out = self.fc(h)
        return out if self.prof is None else out + self.prof(profile)


# torch's deterministic mode is process-global: concurrent sessions share it, switched on by the
# first to enter and restored by the last to leave (a save/restore per session interleaves across
# threads and leaves the application's setting changed). The thread count is per thread (OpenMP),
# so each session sets and restores its own.
_session_lock = threading.Lock()
_session_users = 0
_saved_deterministic = False
_rng_lock = threading.Lock()  # the global RNG is forked by one seeded session at a time


@contextlib.contextmanager
def torch_session(n_threads: int, seed: int | None = None) -> Iterator[None]:
    """Deterministic CPU torch for the duration: a fixed thread count, deterministic algorithms,
    and (with ``seed``) a private RNG stream. The previous settings are restored after (the
    global ones when the last concurrent session ends), so the application's own torch
    configuration is left alone."""
    global _session_users, _saved_deterministic
    with _session_lock:
        if not _session_users:
            _saved_deterministic = torch.are_deterministic_algorithms_enabled()
            torch.use_deterministic_algorithms(True)
        _session_users += 1
    old_threads = torch.get_num_threads()
    torch.set_num_threads(n_threads)
    try:
        if seed is None:
            yield
        else:
            with _rng_lock, torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                yield
    finally:
        torch.set_num_threads(old_threads)
        with _session_lock:
            _session_users -= 1
            if not _session_users:
                torch.use_deterministic_algorithms(_saved_deterministic)


def state_to_numpy(net: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in net.state_dict().items()}


def state_from_numpy(net: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}, strict=True)
