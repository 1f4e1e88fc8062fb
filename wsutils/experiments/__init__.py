"""One module per chapter, with its sizes at each scale (``Scale``, ``scale()``) and its
grid-point functions for :func:`wsutils.run.sweep.run_grid` (import from the module; nothing
is re-exported here): ``word_sensitivity``, ``figure1``, ``random_features``,
``deep_random_features``, ``attention`` (the softmax, far-``n`` and ReLU chapters),
``normalisation``, ``generalization``, ``imdb``, ``trained``, ``word_flips`` (one real word
against a model trained on IMDb reviews) and ``sink`` (the attention-sink chapter)."""
