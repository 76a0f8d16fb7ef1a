"""Build a policy plus its decision stages (gate, shield) by name."""

from __future__ import annotations

from agents.factory import make_policy_stack

build_policy_stack = make_policy_stack
