"""Compact RC thermal network stepped with the exact zero-order-hold discretisation.

Node equation (models.md section 5): ``C_i dT_i/dt = P_i − (T_i − T_amb)/R_i,amb −
Σ_j (T_i − T_j)/R_ij``; in matrix form ``C dx/dt = −G x + P`` with ``x = T − T_amb``. With
``M = C^{-1/2} G C^{-1/2} = U Λ Uᵀ`` (symmetric, positive definite when every node reaches the
ambient), the exact step of length Δ under constant power is::

    x(t+Δ) = Φ x(t) + Γ P,   Φ = C^{-1/2} U e^{-ΛΔ} Uᵀ C^{1/2},
                             Γ = C^{-1/2} U Λ^{-1}(I − e^{-ΛΔ}) Uᵀ C^{-1/2}

Φ and Γ are computed once per step length (cached) and kept as nested lists: the plant's network
has 3–6 nodes, where plain-Python products beat numpy's per-call overhead.
"""

from __future__ import annotations

import numpy as np

from platforms.sim.params import SimParams


class ThermalNetwork:
    def __init__(self, names: tuple[str, ...], cap_j_k, g_w_k, ambient_c: float):
        self.names = tuple(names)
        self.cap = np.asarray(cap_j_k, dtype=np.float64)
        self.g = np.asarray(g_w_k, dtype=np.float64)
        self.ambient_c = float(ambient_c)
        n = len(self.names)
        if self.cap.shape != (n,) or self.g.shape != (n, n):
            raise ValueError(
                "thermal network: capacitance/conductance shapes do not match the nodes"
            )
        s = 1.0 / np.sqrt(self.cap)
        m = s[:, None] * self.g * s[None, :]
        lam, u = np.linalg.eigh(m)
        if lam.min() <= 1e-12:
            raise ValueError("thermal network: some node has no path to ambient (singular G)")
        self._lam, self._u, self._s = lam, u, s
        self._cache: dict[float, tuple[list[list[float]], list[list[float]]]] = {}

    @classmethod
    def from_params(cls, params: SimParams, ambient_c: float | None = None) -> ThermalNetwork:
        names = params.node_names
        idx = {n: i for i, n in enumerate(names)}
        g = np.zeros((len(names), len(names)))
        for node in params.nodes:
            if node.r_amb_k_w:
                g[idx[node.name], idx[node.name]] += 1.0 / node.r_amb_k_w
        for lk in params.links:
            a, b, cond = idx[lk.a], idx[lk.b], 1.0 / lk.r_k_w
            g[a, a] += cond
            g[b, b] += cond
            g[a, b] -= cond
            g[b, a] -= cond
        amb = params.ambient_c if ambient_c is None else ambient_c
        return cls(names, [n.c_j_k for n in params.nodes], g, amb)

    @property
    def n(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        return self.names.index(name)

    def time_constants(self) -> tuple[float, ...]:
        """Modal time constants (s), ascending: fast die modes first, the package last."""
        return tuple(float(x) for x in np.sort(1.0 / self._lam))

    def matrices(self, dt: float) -> tuple[np.ndarray, np.ndarray]:
        """(Φ, Γ) for a step of ``dt`` seconds as numpy arrays."""
        lam, u, s = self._lam, self._u, self._s
        e = np.exp(-lam * dt)
        phi = (s[:, None] * (u * e) @ u.T) / s[None, :]
        gamma = s[:, None] * (u * ((1.0 - e) / lam)) @ u.T * s[None, :]
        return phi, gamma

    def zoh(self, dt: float) -> tuple[list[list[float]], list[list[float]]]:
        """(Φ, Γ) for ``dt`` as nested lists, cached per step length."""
        key = round(float(dt), 12)
        hit = self._cache.get(key)
        if hit is None:
            phi, gamma = self.matrices(key)
            hit = (phi.tolist(), gamma.tolist())
            self._cache[key] = hit
        return hit

    def steady_rise(self, p_w) -> np.ndarray:
        """Steady-state rise over ambient (K) under constant node powers ``p_w``."""
        return np.linalg.solve(self.g, np.asarray(p_w, dtype=np.float64))

    def response(self, rise0, p_w, t: float) -> np.ndarray:
        """Exact rise at time ``t`` from ``rise0`` under constant ``p_w`` (one ZOH step)."""
        phi, gamma = self.matrices(t)
        return phi @ np.asarray(rise0, dtype=np.float64) + gamma @ np.asarray(p_w, dtype=np.float64)
