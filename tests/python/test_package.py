"""The package's shape: private modules import in one direction, and each
runtime keeps its own store."""

import ast
import os
import pickle
import threading

import numpy as np
import pytest

import rdt
from conftest import wait_until

pytestmark = pytest.mark.timeout(120)
PACKAGE = os.path.dirname(rdt.__file__)

# Each module may import only those before it (docs/python.md, "Package layout").
# A subpackage (_cli, ray, vllm) counts as one module here: what its files import
# from outside it; test_import_cycles.py checks the order inside it.
ORDER = ["_errors", "_lib", "_logs", "_receive", "_cuda", "_tensors", "_transport", "_handle", "_store", "_process", "_ref",
         "_pending", "_fetch", "_get", "_view", "_write", "_prepared", "_adapter", "_runtime", "_default", "__init__", "metrics", "_cli", "__main__", "ray", "vllm"]


def _package_module(dotted):
    """The module of this package that an absolute name means, or None."""
    parts = dotted.split(".")
    if parts[0] != "rdt":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _package_imports(tree, depth=0):
    """(module of this package imported, whether at module level, line) for
    every import statement and every importlib.import_module/__import__
    call with a literal name, inside functions too, skipping
    `if TYPE_CHECKING:` blocks (they never run). depth 1: tree is a file of
    a subpackage, whose imports of its own modules are left out."""
    found = []

    def add(module, names, level, top, line):
        if 0 < level <= depth:
            return  # inside the subpackage
        level -= depth
        if level == 1 and module:
            found.append((module.split(".")[0], top, line))
        elif level == 1:
            found.extend((n, top, line) for n in names)
        elif level == 0 and module and _package_module(module) is not None:
            base = _package_module(module)
            # `from rdt import _get` imports a module; `from rdt import get`, the package.
            found.extend((n if base == "__init__" and n in ORDER else base, top, line) for n in names)
        elif level > 1:
            found.append(("..", top, line))  # out of the package: never expected

    def visit(node, top):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", "") == "TYPE_CHECKING":
                continue
            if isinstance(child, ast.ImportFrom):
                add(child.module, [a.name for a in child.names], child.level, top, child.lineno)
            elif isinstance(child, ast.Import):
                for a in child.names:
                    m = _package_module(a.name)
                    if m is not None:
                        found.append((m, top, child.lineno))
            elif isinstance(child, ast.Call) and child.args and isinstance(child.args[0], ast.Constant):
                fn = child.func
                fname = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                arg = child.args[0].value
                if fname in ("import_module", "__import__") and isinstance(arg, str):
                    if arg.startswith("."):
                        found.append((arg.lstrip(".").split(".")[0] or "__init__", top, child.lineno))
                    elif _package_module(arg) is not None:
                        found.append((_package_module(arg), top, child.lineno))
            inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
            visit(child, top and not inner)
    visit(tree, True)
    return found


def _sources(name):
    """(path relative to the package, parsed tree, depth) of the module
    name, or of every file of the subpackage name."""
    if os.path.isdir(os.path.join(PACKAGE, name)):
        rels = sorted(os.path.join(name, f) for f in os.listdir(os.path.join(PACKAGE, name)) if f.endswith(".py"))
        depth = 1
    else:
        rels, depth = [name + ".py"], 0
    out = []
    for rel in rels:
        with open(os.path.join(PACKAGE, rel)) as f:
            out.append((rel, ast.parse(f.read()), depth))
    return out


def test_modules_import_in_one_direction_and_only_at_module_level():
    modules = sorted([f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py")] +
                     [d for d in os.listdir(PACKAGE) if os.path.exists(os.path.join(PACKAGE, d, "__init__.py"))])
    assert sorted(ORDER) == modules, "a module was added or renamed: place it in ORDER and in docs/python.md"
    for name in modules:
        for rel, tree, depth in _sources(name):
            for imported, top, line in _package_imports(tree, depth):
                _check_import(name, f"{rel}:{line}", imported, top)


def _check_import(name, where, imported, top):
    assert imported in ORDER, f"{where} imports {imported}, which is not a module of the package"
    assert ORDER.index(imported) < ORDER.index(name), f"{where} imports {imported}, which is not below it"
    assert top, f"{where} imports {imported} inside a function or class: import it at the top"


def test_the_import_check_sees_lazy_and_absolute_imports():
    # The check above must not miss the ways a module can reach back up.
    source = """
import numpy
from . import _lib, _tensors as t
from ._ref import ObjectRef
if TYPE_CHECKING:
    from ._runtime import Runtime
def f():
    import torch
    from ._runtime import Runtime
    import rdt._default
    from rdt import _get, get
    importlib.import_module("rdt._fetch")
    return __import__("rdt")
class C:
    from ._adapter import register
"""
    got = _package_imports(ast.parse(source))
    assert got == [("_lib", True, 3), ("_tensors", True, 3), ("_ref", True, 4), ("_runtime", False, 9),
                   ("_default", False, 10), ("_get", False, 11), ("__init__", False, 11), ("_fetch", False, 12),
                   ("__init__", False, 13), ("_adapter", False, 15)]


# What _get may use of the objects it works on, beyond their public face:
# the members made for it (see its docstring). Anything else private it
# reads couples it to another class's insides.
GET_SURFACE = {"_handle", "_store", "_group_device", "_receive_frameworks", "_value_of", "_own_entry",
               "_result_by"}


def test_get_uses_only_its_surface_of_other_objects():
    tree = _sources("_get")[0][1]
    modules = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               for a in node.names if a.name.startswith("_")}
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and node.attr.startswith("_") and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in modules)}
    assert used <= GET_SURFACE, f"_get reads {sorted(used - GET_SURFACE)} of other objects"


def test_no_module_sets_attributes_of_what_it_imported():
    # A module above filling in a hook of a module below (say, the class a
    # lower module should make its default runtime from) is an import in
    # disguise: the lower module then depends on the upper one.
    for rel, tree, _ in [src for name in ORDER for src in _sources(name)]:
        name = rel
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level == 1 or (node.module or "").startswith("rdt")):
                imported.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.Import):
                imported.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("rdt"))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for t in targets:
                root = t
                while isinstance(root, (ast.Attribute, ast.Subscript)):
                    root = root.value
                assert not (t is not root and isinstance(root, ast.Name) and root.id in imported), \
                    f"{name}:{node.lineno} sets an attribute of {root.id}, which it imported"


def test_a_pickled_ref_names_the_module_that_makes_the_default_runtime():
    with rdt.Runtime("p") as a:
        ref = a.put(np.arange(3.0))
        blob = pickle.dumps(ref)
        assert b"rdt._default" in blob and b"_unpickle_ref" in blob
        back = pickle.loads(blob)  # a borrow in this process's default runtime, made if needed
        assert back.runtime is rdt.default_runtime() and back.id == ref.id
        assert np.array_equal(rdt.get(back), np.arange(3.0))
        back.close()
        ref.release(revoke_leases=True)


def test_each_runtime_keeps_its_own_store():
    with rdt.Runtime("a") as a, rdt.Runtime("b") as b:
        assert a._store is not b._store
        x = np.arange(4.0)
        ref = a.put(x)
        assert len(a._store.entries) == 1 and not b._store.entries
        ref.serialize()  # indexed by id: the object may come back to a
        assert list(a._store.by_id) == [ref.id] and not b._store.by_id
        borrowed = b.borrow(ref)
        got = b.get(borrowed)
        assert got is not x and np.array_equal(got, x)  # b does not own it: a copy
        back = a.deserialize(ref.serialize())
        with pytest.warns(UserWarning, match="not copies"):  # its ref went to b too
            assert a.get(back) is x  # a does: the put tensor itself
        back.close()
        rdt.wait_tensor_freed(np.empty(1), timeout=1)  # held by no runtime: returns at once
        borrowed.close()
        ref.release(revoke_leases=True)  # the serialized bytes above were never read
        assert wait_until(lambda: not a._store.entries and not a._store.by_id)
        a.wait_tensor_freed(x, timeout=10)


def test_a_stores_finalizer_paths_may_run_inside_its_lock():
    # A fetch dropped while it runs forgets its receive buffers and starts a
    # drain thread from its __del__, which garbage collection may run inside
    # any section of the store that allocates, on the thread holding the lock.
    store = rdt._store.Store()
    buf = bytearray(8)
    ran = threading.Event()
    done = threading.Event()

    def finalizer_inside_the_lock():
        with store.lock:
            store.receiving[1] = buf
            store.forget([(1, buf)])
            store.start_thread(ran.set, (), "rdt-test")
        done.set()

    threading.Thread(target=finalizer_inside_the_lock, daemon=True).start()
    assert done.wait(30), "the store's lock is not re-entrant"
    assert ran.wait(30) and 1 not in store.receiving
    store.join_threads(30)


def test_closing_a_runtime_empties_its_store_only():
    a, b = rdt.Runtime("a"), rdt.Runtime("b")
    try:
        ra, rb = a.put(np.arange(3.0)), b.put(np.arange(3.0))
        pickle.dumps(ra)
        a.close()
        assert not a._store.entries and not a._store.by_id
        assert len(b._store.entries) == 1
        rb.close()
        assert wait_until(lambda: not b._store.entries)
    finally:
        a.close()
        b.close()

