"""The package's shape: private modules import in one direction, and each
runtime keeps its own store."""

import ast
import os
import pickle

import numpy as np
import pytest

import rdt
from conftest import wait_until

pytestmark = pytest.mark.timeout(120)
PACKAGE = os.path.dirname(rdt.__file__)

# Each module may import only those before it (docs/python.md, "Package layout").
ORDER = ["_errors", "_lib", "_tensors", "_transport", "_handle", "_store", "_process", "_ref", "_fetch", "_get",
         "_adapter", "_runtime", "_default", "__init__", "ray"]


def _relative_imports(tree):
    """(module imported, whether at module level) for every `from . import`,
    skipping `if TYPE_CHECKING:` blocks (they never run)."""
    found = []

    def visit(node, top):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", "") == "TYPE_CHECKING":
                continue
            if isinstance(child, ast.ImportFrom) and child.level == 1:
                names = [child.module] if child.module else [a.name for a in child.names]
                found.extend((n, top) for n in names)
            inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, top and not inner)
    visit(tree, True)
    return found


def test_modules_import_in_one_direction_and_only_at_module_level():
    modules = sorted(f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py"))
    assert sorted(ORDER) == modules, "a module was added or renamed: place it in ORDER and in docs/python.md"
    for name in modules:
        with open(os.path.join(PACKAGE, name + ".py")) as f:
            tree = ast.parse(f.read())
        for imported, top in _relative_imports(tree):
            assert top, f"{name} imports {imported} inside a function"
            assert ORDER.index(imported) < ORDER.index(name), f"{name} imports {imported}, which comes later"


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
        rdt._process.PROCESS.warned_shared = False  # it warns once per process
        with pytest.warns(UserWarning, match="not copies"):
            assert a.get(back) is x  # a does: the put tensor itself
        back.close()
        rdt.wait_tensor_freed(np.empty(1), timeout=1)  # held by no runtime: returns at once
        borrowed.close()
        ref.release(revoke_leases=True)  # the serialized bytes above were never read
        assert wait_until(lambda: not a._store.entries and not a._store.by_id)
        a.wait_tensor_freed(x, timeout=10)


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

