"""MoEBERT (Zuo et al., NAACL 2022): the teacher's FFNs cut into experts by neuron importance, one expert per
token, recovered by layer-wise distillation. The method's face: its options (:mod:`.options`), presets
(``presets.yaml``), recipe (:mod:`.recipe`), step commands (:mod:`.steps`) and what ``--method auto`` knows of it
(:mod:`.auto`). Nothing is imported here, so that the command line reads the options without torch; the model
classes register with the Auto classes through :func:`distillery.register_models`."""
