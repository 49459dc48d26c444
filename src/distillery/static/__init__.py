"""Method ``static``: a static embedder distilled from an embedding teacher (model2vec's recipe: the teacher's
vector of each vocabulary token, PCA, SIF weighting), then fine-tuned on the teacher's sentence vectors of the
run's text; saved as sentence-transformers' ``StaticEmbedding``. Its options (:mod:`.options`), presets
(``presets.yaml``), recipe (:mod:`.recipe`), student (:mod:`.modeling_static`) and the token vectors it shares with
the static-embedding baseline (:mod:`.vectors`). Nothing is imported here, so that the command line reads the
options without torch."""
