"""AutoTinyBERT (Yin et al., ACL 2021): sub-architectures of a one-shot super-network. The method's face: its
options (:mod:`.options`), presets (``presets.yaml``), recipe (:mod:`.recipe`), step commands (:mod:`.steps`) and
what ``--method auto`` knows of it (:mod:`.auto`). Nothing is imported here, so that the command line reads the
options without torch; the standalone models register with the Auto classes through
:func:`distillery.register_models`."""
