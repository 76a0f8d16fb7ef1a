"""Build a policy plus its decision stages (gate, shield) by name: the one wiring point."""

from __future__ import annotations

from agents.factory import make_policy
from platforms.spec import BoardSpec


def build_policy_stack(name: str, spec: BoardSpec, **options):
    """Return (policy, stages). Learned policies bring their own gate/shield stages."""
    policy = make_policy(name, spec, **options)
    stages = list(getattr(policy, "stages", []) or [])
    return policy, stages
