"""No import cycle among the package's own modules: every import counts,
those under `if TYPE_CHECKING:` and those inside functions too (a
type-only import that closes a circle still ties the modules together).
The package is read with ast, never imported."""

import ast
import os

import pytest

import rdt

pytestmark = pytest.mark.timeout(60)
PACKAGE = os.path.dirname(rdt.__file__)


def package_modules(root):
    """{dotted name: path} of every module of the package under root; a
    package is named by its __init__.py."""
    base = os.path.basename(root)
    out = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if os.path.exists(os.path.join(folder, d, "__init__.py")))
        rel = os.path.relpath(folder, os.path.dirname(root)).split(os.sep)
        for f in sorted(files):
            if f.endswith(".py"):
                parts = rel if f == "__init__.py" else rel + [f[:-3]]
                out[".".join(parts)] = os.path.join(folder, f)
    assert base in out, f"{root} is not a package"
    return out


def _absolute(module, level, current, is_package):
    """The absolute name `from <level dots><module> import ...` means in
    the module named current."""
    if level == 0:
        return module
    parts = current.split(".")
    if not is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[:-(level - 1)]
    return ".".join(parts + ([module] if module else []))


def imports_of(tree, current, is_package, modules):
    """(imported module of the package, line) for every import in tree:
    import and from-import statements anywhere (module level, functions,
    classes, `if TYPE_CHECKING:` blocks) and importlib.import_module or
    __import__ calls with a literal name. `from P import n` imports the
    module P.n when there is one, else P."""
    found = []

    def add(name, line):
        # The named module, or the nearest enclosing module of the package
        # (`import rdt.x.y` where only rdt.x exists).
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.append((name, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, current, is_package)
            for a in node.names:
                sub = f"{base}.{a.name}"
                add(sub if sub in modules else base, node.lineno)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            fname = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            arg = node.args[0].value
            if fname in ("import_module", "__import__") and isinstance(arg, str):
                level = len(arg) - len(arg.lstrip("."))
                add(_absolute(arg[level:], level, current, is_package) if level else arg, node.lineno)
    return found


def import_graph(root):
    """{module: {imported module: first line}} over the package's modules."""
    modules = package_modules(root)
    graph = {}
    for name, path in modules.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        edges = {}
        for imported, line in imports_of(tree, name, path.endswith("__init__.py"), modules):
            if imported != name:
                edges.setdefault(imported, line)
        graph[name] = edges
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan),
    each as a sorted list."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def describe(graph, comp):
    members = set(comp)
    return "; ".join(f"{m} -> {n} (line {line})" for m in comp for n, line in sorted(graph[m].items())
                     if n in members)


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    found = cycles(graph)
    assert not found, "import cycles among rdt's modules: " + " | ".join(describe(graph, c) for c in found)


def test_the_cycle_check_sees_every_kind_of_import(tmp_path):
    # A package whose modules reach each other in each of the ways the
    # check must not miss; each pair is a cycle of its own.
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from ._a import A\n",
        "_a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._b import B\nA = 1\n",
        "_b.py": "from . import _a\nB = 2\n",
        "_c.py": "def f():\n    import pkg._d\n",
        "_d.py": "import importlib\nimportlib.import_module('pkg._c')\n",
        "_e.py": "class C:\n    from .sub import _f\n",
        "sub/__init__.py": "",
        "sub/_f.py": "from .._e import C\n",
        "_g.py": "x = 1\n",
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    graph = import_graph(str(pkg))
    assert graph["pkg"] == {"pkg._a": 1}
    assert graph["pkg._b"] == {"pkg._a": 1}  # `from . import _a` names the module, not the package
    assert cycles(graph) == [["pkg._a", "pkg._b"], ["pkg._c", "pkg._d"], ["pkg._e", "pkg.sub._f"]]
