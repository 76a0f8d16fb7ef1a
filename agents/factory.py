"""Policy names -> Policy objects (the names of DESIGN.md)."""

from __future__ import annotations

from agents.policy import Policy
from platforms.spec import BoardSpec

GOVERNOR_POLICIES = ("performance", "powersave", "ondemand", "conservative", "schedutil", "maxfreq")
LEARNED_POLICIES = ("hidvfs", "geardvfs", "ztt")
POLICY_NAMES = LEARNED_POLICIES + GOVERNOR_POLICIES


def available_policies() -> tuple[str, ...]:
    """Names that can be built right now (learned ones need their shipped models)."""
    out = list(GOVERNOR_POLICIES)
    try:
        from agents import learned  # noqa: F401

        out = list(LEARNED_POLICIES) + out
    except ImportError:
        pass
    return tuple(out)


def make_policy(name: str, spec: BoardSpec, **options) -> Policy:
    """Build a policy by name for a board. Raises ValueError naming the known policies."""
    name = name.strip().lower()
    if name in GOVERNOR_POLICIES:
        from agents.governors import make_governor

        return make_governor(name, spec)
    if name in LEARNED_POLICIES:
        try:
            from agents.learned import make_learned_policy
        except ImportError as err:
            raise ValueError(f"policy {name!r} is not available in this build ({err})") from None
        return make_learned_policy(name, spec, **options)
    raise ValueError(f"unknown policy {name!r}; known policies: {', '.join(POLICY_NAMES)}")


def parse_policy_list(text: str) -> list[str]:
    names = [p.strip().lower() for p in text.split(",") if p.strip()]
    if not names:
        raise ValueError("no policy given")
    for n in names:
        if n not in POLICY_NAMES:
            raise ValueError(f"unknown policy {n!r}; known policies: {', '.join(POLICY_NAMES)}")
    return names


def make_policy_stack(name: str, spec: BoardSpec, **options):
    """(policy, stages): the policy plus the decision stages it brings (gate, shield, ...)."""
    policy = make_policy(name, spec, **options)
    return policy, list(getattr(policy, "stages", []) or [])
