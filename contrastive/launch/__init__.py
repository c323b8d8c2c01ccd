"""Launchers for clusters: a recipe as a Slurm job (:mod:`contrastive.launch.slurm`, the
``contrastive-slurm`` command) that checkpoints before its time limit and requeues itself.

Standard library only: rendering or submitting a job imports neither torch nor the engine.
"""
