"""Small numpy MLPs for the learned agents: forward, backprop, Adam, masked categorical heads.

Why numpy: the networks are tiny (two hidden layers of <= 64 units), training runs a few
thousand updates on 2 cores, and numpy keeps the training exactly reproducible from a seed with
no extra dependency. The same weights are exported to ONNX (:mod:`agents.onnx_export`) and run
with onnxruntime on the board; float32 everywhere so both paths agree to 1e-5.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: masked logits (sb3-contrib MaskableCategorical, reference/models.md 9.2)
MASKED = -1e8


def learner_entropy(seed: int, stream: int, restart: int = 0) -> list[int]:
    """Seed of one of a learner's random streams: restart 0 draws what a run without restarts
    draws (the shipped models reproduce), another restart its own."""
    return [seed, stream] if restart == 0 else [seed, stream, restart]


@dataclass
class MLP:
    """``weights[i]`` [in, out], ``biases[i]`` [out]; ReLU between layers, linear output."""

    weights: list[np.ndarray]
    biases: list[np.ndarray]

    @classmethod
    def init(cls, sizes: list[int], rng: np.random.Generator, out_scale: float = 0.01) -> MLP:
        """He init for hidden layers, a small output layer (near-uniform initial policy)."""
        ws, bs = [], []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            last = i == len(sizes) - 2
            std = out_scale / np.sqrt(a) if last else np.sqrt(2.0 / a)
            ws.append(rng.normal(0.0, std, size=(a, b)).astype(np.float32))
            bs.append(np.zeros(b, dtype=np.float32))
        return cls(ws, bs)

    @property
    def sizes(self) -> list[int]:
        return [self.weights[0].shape[0]] + [w.shape[1] for w in self.weights]

    @property
    def params(self) -> list[np.ndarray]:
        return [p for pair in zip(self.weights, self.biases) for p in pair]

    def copy(self) -> MLP:
        return MLP([w.copy() for w in self.weights], [b.copy() for b in self.biases])

    def forward(self, x: np.ndarray) -> np.ndarray:
        h = np.asarray(x, dtype=np.float32)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = h @ w + b
            if i < last:
                h = np.maximum(h, 0.0)
        return h

    def forward_cache(self, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """Output and the layer inputs, for :meth:`backward`."""
        h = np.asarray(x, dtype=np.float32)
        acts = [h]
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = h @ w + b
            if i < last:
                h = np.maximum(h, 0.0)
            acts.append(h)
        return h, acts

    def backward(self, acts: list[np.ndarray], grad_out: np.ndarray) -> list[np.ndarray]:
        """Gradients (same order as :attr:`params`) of sum(grad_out * output)."""
        grads: list[np.ndarray] = [None] * (2 * len(self.weights))  # type: ignore[list-item]
        g = np.asarray(grad_out, dtype=np.float32)
        for i in range(len(self.weights) - 1, -1, -1):
            a_in = acts[i]
            grads[2 * i] = a_in.T @ g
            grads[2 * i + 1] = g.sum(axis=0)
            if i > 0:
                g = (g @ self.weights[i].T) * (acts[i] > 0)
        return grads

    def to_dict(self) -> dict:
        return {f"w{i}": w for i, w in enumerate(self.weights)} | {
            f"b{i}": b for i, b in enumerate(self.biases)
        }

    @classmethod
    def from_arrays(cls, arrays: dict, prefix: str = "") -> MLP:
        ws, bs = [], []
        i = 0
        while f"{prefix}w{i}" in arrays:
            ws.append(np.asarray(arrays[f"{prefix}w{i}"], dtype=np.float32))
            bs.append(np.asarray(arrays[f"{prefix}b{i}"], dtype=np.float32))
            i += 1
        if not ws:
            raise ValueError(f"no layers with prefix {prefix!r} in the arrays")
        return cls(ws, bs)


class Adam:
    """Adam over a list of arrays (updated in place), with global-norm gradient clipping."""

    def __init__(
        self,
        params: list[np.ndarray],
        lr: float = 3e-3,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-8,
        clip: float | None = 1.0,
    ):
        self.params = params
        self.lr, self.b1, self.b2, self.eps, self.clip = lr, b1, b2, eps, clip
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads: list[np.ndarray]) -> float:
        """Apply one update (gradient DEscent on ``grads``); returns the pre-clip norm."""
        norm = float(np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads)))
        scale = 1.0
        if self.clip is not None and norm > self.clip:
            scale = self.clip / (norm + 1e-12)
        self.t += 1
        c1 = 1.0 - self.b1**self.t
        c2 = 1.0 - self.b2**self.t
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            g = g * scale
            m *= self.b1
            m += (1.0 - self.b1) * g
            v *= self.b2
            v += (1.0 - self.b2) * g * g
            p -= (self.lr * (m / c1) / (np.sqrt(v / c2) + self.eps)).astype(p.dtype)
        return norm


# --------------------------------------------------------------------------------------------
# Masked categorical heads


def masked_logits(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Logits with infeasible actions (mask False) set to :data:`MASKED`."""
    return np.where(mask, logits, np.float32(MASKED)).astype(np.float32)


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def sample_masked(
    logits: np.ndarray, mask: np.ndarray, rng: np.random.Generator | None
) -> tuple[int, float]:
    """(action, log-prob) from one masked head; the argmax when ``rng`` is None."""
    z = masked_logits(logits, mask).astype(np.float64)
    if rng is None:
        a = int(np.argmax(z))
    else:
        p = softmax(z)
        a = int(rng.choice(len(p), p=p))
    return a, float(log_softmax(z)[a])


def head_grad(logits: np.ndarray, mask: np.ndarray, action: int, weight: float) -> np.ndarray:
    """d(-weight * log pi(action))/d logits for one masked head (masked entries get 0)."""
    z = masked_logits(logits, mask).astype(np.float64)
    p = softmax(z)
    g = p.copy()
    g[action] -= 1.0
    g *= weight
    g[~mask] = 0.0
    return g.astype(np.float32)


def entropy_grad(logits: np.ndarray, mask: np.ndarray, weight: float) -> tuple[float, np.ndarray]:
    """Entropy of a masked head and d(-weight * H)/d logits (masked entries excluded)."""
    z = masked_logits(logits, mask).astype(np.float64)
    p = softmax(z)
    lp = log_softmax(z)
    lp = np.where(mask, lp, 0.0)
    h = float(-(p * lp).sum())
    # dH/dz_i = -p_i (log p_i + H)
    g = -p * (lp + h)
    g = np.where(mask, -weight * g, 0.0)
    return h, g.astype(np.float32)


__all__ = [
    "MASKED",
    "MLP",
    "Adam",
    "learner_entropy",
    "masked_logits",
    "softmax",
    "log_softmax",
    "sample_masked",
    "head_grad",
    "entropy_grad",
]
