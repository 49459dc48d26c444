"""The one YAML loader of everything distillery reads (settings files, run folders' config.yaml): plain data as
``yaml.safe_load`` gives it, with the expansion of aliases bounded and repeated keys refused."""

from __future__ import annotations

from typing import Any

import yaml

# A settings file has a few dozen values. A document that expands (anchors and aliases counted at
# every use) to more than this is an alias bomb ("billion laughs") or not a settings file at all;
# it is refused before anything walks, copies or prints the expanded tree.
MAX_YAML_VALUES = 10_000


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a document expanding to more than MAX_YAML_VALUES values, or
    one that contains itself, before constructing it (PyYAML shares an aliased node, but everything
    after the load, from the error messages to yaml.safe_dump, walks the expanded tree)."""

    def construct_document(self, node):
        _check_expansion(node)
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        # PyYAML keeps the last of two equal keys without a word: `method: distill` then `method: cmow`
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} appears twice (first on line {seen[key].start_mark.line + 1})",
                        key_node.start_mark)
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _check_expansion(root: yaml.Node) -> None:
    """Count the values of ``root`` with every alias expanded, without expanding: an iterative
    depth-first walk that sizes each distinct node once."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _yaml_children(node)
        if done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[key] > MAX_YAML_VALUES:
                raise yaml.constructor.ConstructorError(
                    None, None, f"it expands to more than {MAX_YAML_VALUES} values (aliases counted at every "
                    "use); a settings file holds a few dozen", node.start_mark)
        elif key in on_path:
            raise yaml.constructor.ConstructorError(None, None, "an alias refers to a value that contains it",
                                                    node.start_mark)
        elif key not in sizes:
            on_path.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)


def _yaml_children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def load_yaml(text: str) -> Any:
    """Plain data from YAML text, as ``yaml.safe_load`` (no Python objects), with the expansion
    bounded (see MAX_YAML_VALUES): the one loader of every YAML distillery reads."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)
    except RecursionError:  # PyYAML composes nested collections recursively
        raise yaml.YAMLError("it nests collections too deeply for a settings file") from None


def yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong and where (PyYAML's own text spans several)."""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    mark = getattr(error, "problem_mark", None)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else problem
