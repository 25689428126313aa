"""Framework integrations: each drives the public step lifecycle of
:class:`tracealyze.recorder.Recorder` from a framework's own hooks.

* :mod:`.hf` — ``TracealyzeCallback`` for the Hugging Face ``transformers.Trainer``;
* :mod:`.lightning` — ``TracealyzeCallback`` for ``lightning.pytorch`` and
  ``pytorch_lightning``;
* :mod:`.auto` — what ``tracealyze record -- python train.py`` starts in an unmodified
  script: global optimizer hooks, and the two callbacks added to Trainers it sees created.

Importing this package imports no framework; each module imports only its own.
"""
