"""Structured pruning to a latency measured here (CoFi, Xia et al. 2022, with a latency model instead of a
parameter count): hard-concrete masks on heads, FFN neurons, the hidden dimension and whole sub-layers, learned
with layer-wise distillation, then removed and the smaller model fine-tuned. The method's face: its options
(:mod:`.options`), presets (``presets.yaml``) and recipe (:mod:`.recipe`). Nothing is imported here, so that the
command line reads the options without torch; the pruned student registers with the Auto classes through
:func:`distillery.register_models`."""
