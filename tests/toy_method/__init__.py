"""A toy method, the whole of what adding a method takes: this package (options, presets, recipe, auto) and one
line in ``distillery.method.METHODS`` (tests/test_method_registry.py adds it). Its student is the teacher's first
layers, copied and not trained: trivial, but a real student that goes through the whole run."""
