"""Method ``distill``: a shallower copy of the teacher (:mod:`.recipe`), or a pretrained encoder given as
``--student`` (:mod:`.pretrained`, with :mod:`.span_carry` for SQuAD across tokenizers), trained on the
teacher's outputs. Nothing is imported here, so that the command line reads the options without torch."""
