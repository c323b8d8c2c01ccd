"""Commands built on the training engine, and launchers for clusters:

- :mod:`contrastive.launch.finetune` (``contrastive-finetune``): full fine-tuning of an image
  encoder with a classification head on labelled images;
- :mod:`contrastive.launch.slurm` (``contrastive-slurm``): a recipe as a Slurm job that
  checkpoints before its time limit and requeues itself (standard library only: rendering or
  submitting a job imports neither torch nor the engine); ``submit --submitit`` submits it
  from Python with submitit instead (:mod:`contrastive.launch.slurm_submitit`, the
  ``submitit`` extra, imported only then).

The top layer of the package (CONTRIBUTING.md, Layers), beside ``recipes/`` and ``tools/``.
"""
