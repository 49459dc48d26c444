"""The package's shape, checked so that it stays: imports only go down the layers of docs/architecture.md's data
flow (no cycle, late imports counted), no source file or function outgrows a newcomer's reading
(600 lines a file, 80 a function), no test module imports another, and the README stays the short
version (150 lines)."""

import ast
import importlib.util
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "distillery"
MAX_LINES = 600
MAX_FUNCTION_LINES = 80

# Lowest first: a module may import from its own layer (without a cycle) and the layers below.
LAYERS = [
    ("services", ("distillery.errors", "distillery.safe_yaml", "distillery.config", "distillery.weights", "distillery.encoders", "distillery.folders", "distillery.ownership", "distillery.distributed",
                  "distillery.data", "distillery.kinds", "distillery.metrics", "distillery.training", "distillery.modeling",
                  "distillery.runtime", "distillery.evaluation", "distillery.bench", "distillery.importance",
                  "distillery.teacher", "distillery.weights", "distillery.encoders", "distillery.mpnet_download",
                  "distillery.markdown", "distillery.run_record")),
    ("methods and export", ("distillery.method", "distillery.method_context", "distillery.distill", "distillery.moebert", "distillery.cmow",
                            "distillery.autotinybert", "distillery.prune", "distillery.static", "distillery.export")),
    ("pipeline", ("distillery.pipeline", "distillery.auto", "distillery.auto_budget", "distillery.auto_choice", "distillery.auto_report", "distillery.report", "distillery.report_parts", "distillery.card", "distillery.live_baselines", "distillery.plot")),
    ("cli", ("distillery.cli",)),
]


def import_graph():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A method package's step commands (``distillery.<method>.steps``) are its command-line face: the cli layer's.
STEPS = "steps"


def layer_of(module: str) -> int | None:
    if module.count(".") == 2 and module.endswith("." + STEPS):
        return len(LAYERS) - 1
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None  # the package itself (the public API imports the pipeline; nothing imports it)


def test_no_import_cycle():
    tool = import_graph()
    assert tool.cycles(tool.edges()) == []


def test_imports_only_go_down_the_layers():
    graph = import_graph().edges()
    unplaced = sorted(m for m in graph if m != "distillery" and layer_of(m) is None)
    assert not unplaced, f"modules in no layer: {unplaced}"
    upward = [f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})"
              for a, targets in graph.items() for b in targets
              if a != "distillery" and b != "distillery" and layer_of(b) > layer_of(a)]
    assert not upward, "\n".join(upward)
    assert not [a for a, targets in graph.items() if "distillery" in targets], "only users import the package itself"


def test_no_source_file_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_no_function_over_80_lines():
    long = [f"{p.relative_to(ROOT)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for p in sorted(SRC.rglob("*.py")) for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, "\n".join(long)


def test_no_test_module_imports_another():
    """Test modules share builders through tests/helpers.py (and conftest's fixtures), so that running one
    test file never collects or depends on another's."""
    import ast

    tests = ROOT / "tests"
    test_modules = {p.stem for p in tests.glob("test_*.py")}
    offenders = []
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):  # ``from tests import test_x`` names the module last
                names = [f"{node.module or ''}.{a.name}" for a in node.names]
            else:
                continue
            if any(part in test_modules for name in names for part in name.split(".")):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == [], "import shared builders from tests/helpers.py instead"


def test_readme_stays_short_and_keeps_the_test_command():
    """The README is the short version (details live in docs/); CI runs its test command."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "make test " in text and "<!-- summary:start -->" in text and "| family |" in text


def test_batches_become_model_inputs_in_one_place():
    """Only ``distillery.data.encode.model_inputs`` picks a model's inputs out of a batch: no other module
    reads the batch columns' lists or a forward's signature, nor keeps or drops batch keys by hand. (A
    student's modeling file may read the signature of the family model it wraps: it passes its own
    arguments on, not a batch.)"""
    import re

    home = SRC / "data" / "encode.py"
    by_hand = re.compile(r"\bMODEL_INPUTS\b|signature\([^)]*forward|\bk not in TARGETS\b"
                         r"|\w+, \w+ in \w*batch\w*\.items\(\) if|\(\"labels\", \"start_positions\"")
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in SRC.rglob("*.py")
             if p != home and not p.name.startswith("modeling_")
             for i, line in enumerate(p.read_text().splitlines(), 1) if by_hand.search(line)]
    assert not found, "\n".join(found)


def test_the_report_tower_imports_no_torch():
    """The report, the model card and auto read a run's records without torch or transformers (which loads
    torch): ``distillery report`` and a plan start fast, and a model builder never sneaks under them."""
    import subprocess
    import sys

    code = ("import sys; import distillery.report, distillery.card, distillery.auto; "
            "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules); print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# Imports of the package's own modules inside functions hide the dependency graph: they are kept where a heavy
# library (torch, transformers, onnx, scikit-learn) would otherwise load with a light module (the command line,
# the report, the card, auto), and each says why or is such a case. The count may only go down.
MAX_LATE_OWN_IMPORTS = 80


def test_imports_of_the_package_sit_at_the_top_where_nothing_heavy_is_at_stake():
    late = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                late += [f"{path.relative_to(SRC)}:{node.lineno}" for node in ast.walk(function)
                         if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("distillery")
                         or isinstance(node, ast.Import) and any(a.name.startswith("distillery") for a in node.names)]
    assert len(late) <= MAX_LATE_OWN_IMPORTS, f"{len(late)} imports of distillery inside functions: {late}"
