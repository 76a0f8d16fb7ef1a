"""Cluster placement policies: DAG-aware heuristics and the learned ``higfrl`` actor-critic.

Every policy implements the :class:`platforms.cluster.simcluster.Placer` contract, so the same
object drives the simulated cluster and the live scheduler extender.
"""
