"""The import graph of otzoo's packages: no cycle between files or between packages, each package uses only those
below it, and no project import is hidden inside a function.

Read from the source with ``ast`` (nothing is imported). A package's ``__init__`` that re-exports its own
sub-modules contains them; that edge is containment, not a dependency, and is left out of the package graph.
"""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("ot_layers", "zoo", "training", "export", "explain", "otzoo")
# Which top-level packages each one may import (the flow of data: layers <- zoo <- training <- otzoo; export and
# explain see models and arrays only).
ALLOWED = {
    "ot_layers": set(),
    "zoo": {"ot_layers"},
    "training": {"ot_layers", "zoo"},
    "export": {"ot_layers"},
    "explain": {"ot_layers"},
    "otzoo": {"ot_layers", "zoo", "training", "export", "explain"},
}


def _modules():
    """``{dotted module name: path}`` of every project file."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for file in files:
                if file.endswith(".py"):
                    path = os.path.join(folder, file)
                    dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    found[dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
    return found


MODULES = _modules()


def _is_package(module):
    return MODULES[module].endswith("__init__.py")


def _resolve(name):
    """The project module ``name`` refers to (itself, or the closest enclosing one), or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module):
    """``[(imported project module, line, inside a function)]`` of ``module``."""
    tree = ast.parse(open(MODULES[module]).read())
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    target = _resolve(alias.name)
                    if target:
                        found.append((target, child.lineno, in_function))
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                for alias in child.names:
                    target = _resolve(f"{child.module}.{alias.name}") or _resolve(child.module)
                    if target:
                        found.append((target, child.lineno, in_function))
            visit(child, nested)

    visit(tree, False)
    return found


IMPORTS = {module: _imports(module) for module in MODULES}


def _package_of(module):
    return module if _is_package(module) else module.rpartition(".")[0]


def _find_cycle(graph):
    """One cycle of ``graph`` (``{node: set of nodes}``) as a list, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_graph_reads_the_project():
    assert "otzoo.cli" in MODULES and "training.recipes" in MODULES and "ot_layers.solvers.sinkhorn" in MODULES
    assert any(target == "training.recipes" for target, _, _ in IMPORTS["otzoo.cli"])


def test_no_import_cycle_between_files():
    graph = {module: {target for target, _, _ in imports if target != module} for module, imports in IMPORTS.items()}
    # A module importing a name from its own package's __init__ depends on the __init__'s whole closure; a package
    # re-exporting its children must then not be imported by them, which the graph below checks as it is.
    assert _find_cycle(graph) is None, f"import cycle: {' -> '.join(_find_cycle(graph))}"


def test_no_import_cycle_between_packages():
    graph = {}
    for module, imports in IMPORTS.items():
        source = _package_of(module)
        for target, _, _ in imports:
            destination = _package_of(target)
            contained = _is_package(module) and destination.startswith(module + ".")
            if destination != source and not contained:
                graph.setdefault(source, set()).add(destination)
    cycle = _find_cycle(graph)
    assert cycle is None, f"package cycle: {' -> '.join(cycle)}"


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_uses_only_those_below_it(package):
    wrong = sorted({f"{module} imports {target} (line {line})" for module, imports in IMPORTS.items()
                    if module.partition(".")[0] == package for target, line, _ in imports
                    if target.partition(".")[0] not in ALLOWED[package] | {package}})
    assert not wrong, "\n".join(wrong)


def test_no_project_import_inside_a_function():
    hidden = sorted(f"{module}:{line} imports {target}" for module, imports in IMPORTS.items()
                    for target, line, in_function in imports if in_function)
    assert not hidden, "\n".join(hidden)


def test_the_checks_catch_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}}) is None
