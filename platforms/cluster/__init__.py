"""The simulated cluster and its trace input: Alibaba v2018 ``batch_task.csv`` reader, a
synthetic generator in the same format, and an event-driven simulator of heterogeneous boards.
"""
