"""A training run's folder, shared by every trainer and by evaluation.

- `glam.runs.folder` (torch-free): the folder's layout as its readers see it, the newest
  checkpoint and its policy; evaluation and the scripts read runs through it alone.
- `glam.runs.checkpoint`: atomic checkpoints, written and checked before a resume.
- `glam.runs.lifecycle`: a run from start to resume: open and check the folder, pick and check
  the checkpoint, check that it continues the same run, restore its state.
- `glam.runs.errors` (torch-free): why a run stops with an error.

The PPO trainer (`glam.ppo`) and DRRN's (`glam.baselines.drrn_trainer`) open, checkpoint and
resume their runs here; nothing in this package imports a trainer.
"""
