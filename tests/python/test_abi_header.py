"""The ctypes declarations in rdt._lib and the status codes in rdt._errors
agree with include/rdt.h, the one hand-written statement of the C ABI.

The header is parsed (structs, function declarations, callback typedefs,
#define constants, RDT_STATUS_LIST) and every fact the Python package repeats
is compared with it: struct field names, order and types, argtypes and
restype of every function, callback signatures, constants and status codes.
A C compiler then reports the real sizes and offsets, which the ctypes
structures must reproduce. The checks run against mutated copies of the
header too, so a check that stopped seeing anything would fail here.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from ctypes import POINTER, Structure
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import pytest

from rdt import _errors, _lib

pytestmark = pytest.mark.timeout(120)

HEADER = Path(__file__).resolve().parents[2] / "include" / "rdt.h"

# ---------------------------------------------------------------------------
# Parsing rdt.h (its own plain style: one declaration per statement, no
# nested parentheses in parameter lists).
# ---------------------------------------------------------------------------


class Decl(NamedTuple):
    """A declared name with a normalized C type: "int64_t*", "char[33]",
    or "fn(ret;arg,arg)" for a function pointer."""

    name: str
    ctype: str


class Header(NamedTuple):
    defines: Dict[str, int]
    statuses: Dict[str, int]
    structs: Dict[str, List[Decl]]
    opaque: List[str]
    callbacks: Dict[str, str]
    functions: Dict[str, Tuple[str, List[str]]]
    # The renamed names (rdt.h, "Renamed names"): each deprecated typedef
    # and function, and the name RDT_DEPRECATED("use ...") gives instead.
    renamed: Dict[str, str]


def _code(text: str) -> str:
    """Comments removed and continuation lines joined."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return text.replace("\\\n", " ")


def _type(text: str) -> str:
    """"const rdt_ref *const *" -> "rdt_ref**"."""
    text = re.sub(r"\b(const|struct|enum)\b", " ", text)
    return re.sub(r"\s+", "", text)


def _param_type(param: str) -> str:
    """A parameter's type without its name."""
    param = param.strip()
    m = re.fullmatch(r"(.*?[\s*])(\w+)", param)
    return _type(m.group(1) if m and _type(m.group(1)) else param)


def _fn_type(ret: str, params: str) -> str:
    args = [] if params.strip() in ("", "void") else [_param_type(p) for p in params.split(",")]
    return f"fn({_type(ret)};{','.join(args)})"


def _eval(expr: str, defines: Dict[str, int]) -> Optional[int]:
    expr = re.sub(r"\b(\d+)[uUlL]+\b", r"\1", expr)
    expr = re.sub(r"\bRDT_\w+\b", lambda m: str(defines.get(m.group(0), m.group(0))), expr)
    if not re.fullmatch(r"[\d\s()+\-*<>|]+", expr):
        return None
    return int(eval(expr, {"__builtins__": {}}))  # digits and operators only


def _declaration(stmt: str, defines: Dict[str, int]) -> Decl:
    m = re.fullmatch(r"(.*?)\(\s*\*\s*(\w+)\s*\)\s*\((.*)\)", stmt, flags=re.S)
    if m:
        return Decl(m.group(2), _fn_type(m.group(1), m.group(3)))
    m = re.fullmatch(r"(.*?)\b(\w+)\s*\[(.+)\]", stmt, flags=re.S)
    if m:
        return Decl(m.group(2), f"{_type(m.group(1))}[{_eval(m.group(3), defines)}]")
    m = re.fullmatch(r"(.*?[\s*])(\w+)", stmt, flags=re.S)
    assert m, f"cannot parse the declaration {stmt!r}"
    return Decl(m.group(2), _type(m.group(1)))


def parse_header(text: str) -> Header:
    code = _code(text)
    defines: Dict[str, int] = {}
    for name, value in re.findall(r"^\s*#define\s+(RDT_\w+)[ \t]+(.+)$", code, flags=re.M):
        v = _eval(value, defines)
        if v is not None:
            defines[name] = v
    lists = re.search(r"#define\s+RDT_STATUS_LIST\(X\)(.*)", code)
    statuses = {n: int(v) for n, v in re.findall(r"X\((RDT_\w+),\s*(-?\d+)\)", lists.group(1))} if lists else {}
    structs = {
        name: [_declaration(s.strip(), defines) for s in body.split(";") if s.strip()]
        for name, body, _ in re.findall(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", code, flags=re.S)
    }
    opaque = re.findall(r"typedef\s+struct\s+(\w+)\s+\w+\s*;", code)
    callbacks = {name: _fn_type(ret, params)
                 for ret, name, params in re.findall(r"typedef\s+([\w\s*]+?)\(\s*\*\s*(\w+)\s*\)\s*\(([^)]*)\)\s*;",
                                                     code)}
    functions = {}
    renamed = dict(re.findall(r"typedef\s+\w+\s+(\w+)\s+RDT_DEPRECATED\(\s*\"use (\w+)\"\s*\)\s*;", code))
    renamed.update((name, use) for use, name in re.findall(
        r"RDT_DEPRECATED\(\s*\"use (\w+)\"\s*\)\s*static\s+inline\s+[\w\s*]+?\b(\w+)\s*\(", code))
    for ret, name, params, use in re.findall(
            r"\bRDT_API\s+([\w\s*]+?)\b(\w+)\s*\(([^)]*)\)\s*(?:RDT_DEPRECATED\(\s*\"use (\w+)\"\s*\))?\s*;", code):
        args = [] if params.strip() in ("", "void") else [_param_type(p) for p in params.split(",")]
        functions[name] = (_type(ret), args)
        if use:
            renamed[name] = use
    return Header(defines, statuses, structs, opaque, callbacks, functions, renamed)


# ---------------------------------------------------------------------------
# Comparing with the ctypes declarations.
# ---------------------------------------------------------------------------

SCALARS = {
    "int8_t": ctypes.c_int8, "uint8_t": ctypes.c_uint8, "int16_t": ctypes.c_int16, "uint16_t": ctypes.c_uint16,
    "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64, "size_t": ctypes.c_size_t, "int": ctypes.c_int, "char": ctypes.c_char,
    "rdt_status": ctypes.c_int32,  # an enum of int size; ctypes passes it as int32
}


def structure_classes() -> Dict[str, type]:
    """_lib's Structure subclasses by the C name they mirror: "RuntimeOptions"
    and "TransportVTable" mirror rdt_runtime_options and rdt_transport_vtable."""
    classes = {}
    for value in vars(_lib).values():
        if isinstance(value, type) and issubclass(value, Structure) and value is not Structure:
            classes[value.__name__.lower()] = value
    return classes


def _struct_for(c_name: str, classes: Dict[str, type]) -> Optional[type]:
    return classes.get(c_name.removeprefix("rdt_").replace("_", "").lower())


def _describe(t: Any) -> str:
    if t is None:
        return "None"
    if hasattr(t, "_argtypes_"):
        return f"CFUNCTYPE({_describe(t._restype_)}, {', '.join(_describe(a) for a in t._argtypes_)})"
    return getattr(t, "__name__", repr(t))


class Checker:
    """Compares one parsed header with the ctypes declarations."""

    def __init__(self, header: Header):
        self.h = header
        self.classes = structure_classes()

    def expected(self, ctype: str) -> Any:
        """The exact ctypes type for a C type (struct fields), or None if
        there is none."""
        if ctype == "void":
            return None
        if ctype.startswith("fn("):
            return ctype  # compared by signature, see matches()
        if ctype in self.h.callbacks:
            return self.h.callbacks[ctype]
        m = re.fullmatch(r"(.+)\[(\d+)\]", ctype)
        if m:
            element = self.expected(m.group(1))
            return element * int(m.group(2)) if element is not None else None
        if ctype in SCALARS:
            return SCALARS[ctype]
        if ctype in ("char*",):
            return ctypes.c_char_p
        if ctype.endswith("*"):
            pointee = ctype[:-1]
            if pointee == "void" or pointee in self.h.opaque:
                return ctypes.c_void_p
            target = self.expected(pointee)
            return POINTER(target) if target is not None and not isinstance(target, str) else None
        return _struct_for(ctype, self.classes) if ctype in self.h.structs else None

    def matches(self, ctype: str, py: Any, relaxed: bool) -> bool:
        """Whether ctypes type `py` passes C type `ctype`. Relaxed (function
        arguments): any pointer may travel as c_void_p, and a pointer to
        bytes as c_char_p, as the binding packs arrays and handles itself."""
        want = self.expected(ctype)
        if isinstance(want, str):  # a function pointer
            if not hasattr(py, "_argtypes_"):
                return False
            ret, args = re.fullmatch(r"fn\((.*?);(.*)\)", want).groups()
            args_list = args.split(",") if args else []
            return (self.matches(ret, py._restype_, False) and len(args_list) == len(py._argtypes_)
                    and all(self.matches(a, p, True) for a, p in zip(args_list, py._argtypes_)))
        if relaxed and ctype.endswith("*"):
            if py is ctypes.c_void_p:
                return True
            if py is ctypes.c_char_p and ctype in ("char*", "void*"):
                return True
            if hasattr(py, "_type_") and ctype[:-1] not in SCALARS and ctype[:-1] not in self.h.structs:
                return self.matches(ctype[:-1], py._type_, True)  # a pointer to a pointer
        if want is None:
            return py is None and ctype == "void"
        if py is want:
            return True
        # Arrays and pointers are distinct ctypes classes: compare what they hold.
        if hasattr(want, "_length_"):
            return getattr(py, "_length_", None) == want._length_ and py._type_ is want._type_
        if hasattr(want, "contents"):
            return hasattr(py, "contents") and py._type_ is want._type_
        return False

    def struct_problems(self) -> List[str]:
        problems = []
        for c_name, fields in self.h.structs.items():
            cls = _struct_for(c_name, self.classes)
            if cls is None:
                problems.append(f"{c_name}: no ctypes Structure in rdt._lib mirrors it")
                continue
            py_fields = list(cls._fields_)
            c_names = [f.name for f in fields]
            py_names = [f[0] for f in py_fields]
            if c_names != py_names:
                problems.append(f"{c_name} -> {cls.__name__}: fields {c_names} in rdt.h, {py_names} in ctypes")
                continue
            for field, (_, py_type) in zip(fields, py_fields):
                if not self.matches(field.ctype, py_type, False):
                    problems.append(f"{c_name}.{field.name}: {field.ctype} in rdt.h, "
                                    f"{_describe(py_type)} in {cls.__name__}")
        return problems

    def signature_problems(self) -> List[str]:
        problems = []
        sigs = _lib.SIGNATURES
        # The binding calls the new names only; each renamed function takes
        # and returns what its replacement does.
        for name in sorted(set(self.h.renamed) & set(self.h.functions)):
            use = self.h.renamed[name]
            if name in sigs:
                problems.append(f"{name}: renamed to {use} in rdt.h, still in _lib.SIGNATURES")
            if self.h.functions[name] != self.h.functions.get(use):
                problems.append(f"{name}: renamed to {use} in rdt.h, but their signatures differ")
        for name in sorted(set(self.h.functions) - set(self.h.renamed) - set(sigs)):
            problems.append(f"{name}: declared in rdt.h, missing from _lib.SIGNATURES")
        for name in sorted(set(sigs) - set(self.h.functions)):
            problems.append(f"{name}: in _lib.SIGNATURES, not declared in rdt.h")
        for name in sorted(set(sigs) & set(self.h.functions)):
            ret, args = self.h.functions[name]
            py_ret, py_args = sigs[name]
            if not self.matches(ret, py_ret, False) and not (ret == "char*" and py_ret is ctypes.c_char_p):
                problems.append(f"{name}: returns {ret} in rdt.h, restype {_describe(py_ret)}")
            if len(args) != len(py_args):
                problems.append(f"{name}: {len(args)} parameters in rdt.h, {len(py_args)} argtypes")
                continue
            for i, (a, p) in enumerate(zip(args, py_args)):
                if not self.matches(a, p, True):
                    problems.append(f"{name}: parameter {i} is {a} in rdt.h, argtype {_describe(p)}")
        return problems

    def status_problems(self) -> List[str]:
        problems = []
        if not self.h.statuses:
            return ["rdt.h: no RDT_STATUS_LIST found"]
        errors = dict(_errors._BY_STATUS)
        for name, value in self.h.statuses.items():
            if name != "RDT_OK" and value not in errors:
                problems.append(f"{name} ({value}): no exception class in rdt._errors")
            constant = name.removeprefix("RDT_")
            if hasattr(_lib, constant) and getattr(_lib, constant) != value:
                problems.append(f"{name} is {value} in rdt.h, _lib.{constant} is {getattr(_lib, constant)}")
        for value, cls in errors.items():
            if value not in self.h.statuses.values():
                problems.append(f"{cls.__name__}.status {value} is not a code of rdt.h")
        if _errors.RdtError.status != self.h.statuses.get("RDT_ERR_INTERNAL"):
            problems.append("RdtError.status is not RDT_ERR_INTERNAL")
        return problems

    def constant_problems(self) -> List[str]:
        problems = []
        for name, value in vars(_lib).items():
            define = f"RDT_{name}"
            if name.isupper() and isinstance(value, int) and define in self.h.defines:
                if self.h.defines[define] != value:
                    problems.append(f"{define} is {self.h.defines[define]} in rdt.h, _lib.{name} is {value}")
        for level, value in _lib.LOG_LEVELS.items():
            define = f"RDT_LOG_{(level or 'default').upper()}"
            if self.h.defines.get(define) != value:
                problems.append(f"{define} is {self.h.defines.get(define)} in rdt.h, LOG_LEVELS[{level!r}] is {value}")
        return problems

    def all_problems(self) -> List[str]:
        return self.struct_problems() + self.signature_problems() + self.status_problems() + self.constant_problems()


def header_text() -> str:
    return HEADER.read_text()


# ---------------------------------------------------------------------------
# The checks on the real header.
# ---------------------------------------------------------------------------


def test_the_parser_sees_the_whole_header():
    h = parse_header(header_text())
    # Counted by hand; a parser that misses declarations would let mismatches through.
    assert len(h.statuses) == len(re.findall(r"^\s*X\(RDT_", header_text(), flags=re.M)) == 17
    assert len(h.functions) == header_text().count("RDT_API ") - 1  # minus the #define RDT_API
    assert len(h.structs) == len(re.findall(r"^typedef struct \w+ \{", header_text(), flags=re.M)) == 20
    assert set(h.opaque) == {"rdt_runtime", "rdt_ref", "rdt_pending", "rdt_buffer", "rdt_prepared", "rdt_view"}
    assert h.structs["rdt_tensor"][4] == Decl("shape", "int64_t*")
    assert h.structs["rdt_object_info"][2] == Decl("object_id", "char[33]")
    assert h.functions["rdt_get_start"][1][1] == "rdt_ref**"
    assert len(h.renamed) == header_text().count("RDT_DEPRECATED(\"use ") == 11
    assert h.renamed["rdt_fetch_start"] == "rdt_get_start" and h.renamed["rdt_source_range"] == "rdt_range"
    assert h.callbacks["rdt_release_fn"] == "fn(void;void*)"
    assert h.defines["RDT_RUNTIME_QUEUE_RELEASES"] == 4


def test_ctypes_structures_match_the_header():
    assert Checker(parse_header(header_text())).struct_problems() == []


def test_function_signatures_match_the_header():
    assert Checker(parse_header(header_text())).signature_problems() == []


def test_status_codes_match_the_header():
    assert Checker(parse_header(header_text())).status_problems() == []


def test_constants_match_the_header():
    assert Checker(parse_header(header_text())).constant_problems() == []


# ---------------------------------------------------------------------------
# Sizes and offsets, as a C compiler lays the structs out.
# ---------------------------------------------------------------------------


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler (cc, gcc or clang) to lay out rdt.h's structs")
    return cc


def compiled_layout(header: Path, tmp: Path, cc: str) -> Dict[str, int]:
    """sizeof of every struct and offsetof of every field, from the compiler."""
    h = parse_header(header.read_text())
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "rdt.h"', "int main(void) {"]
    for name, fields in h.structs.items():
        lines.append(f'  printf("{name} %zu\\n", sizeof({name}));')
        for f in fields:
            lines.append(f'  printf("{name}.{f.name} %zu\\n", offsetof({name}, {f.name}));')
    lines += ["  return 0;", "}"]
    (tmp / "layout.c").write_text("\n".join(lines) + "\n")
    exe = tmp / "layout"
    subprocess.run([cc, "-std=c99", "-I", str(header.parent), "-o", str(exe), str(tmp / "layout.c")],
                   check=True, capture_output=True, timeout=60)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=30).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


def layout_problems(layout: Dict[str, int], header: Header) -> List[str]:
    classes = structure_classes()
    problems = []
    for name, fields in header.structs.items():
        cls = _struct_for(name, classes)
        if cls is None:
            continue  # reported by struct_problems
        if ctypes.sizeof(cls) != layout[name]:
            problems.append(f"sizeof({name}) is {layout[name]}, ctypes.sizeof({cls.__name__}) "
                            f"is {ctypes.sizeof(cls)}")
        for f in fields:
            py = getattr(cls, f.name, None)
            offset = layout[f"{name}.{f.name}"]
            if py is None or py.offset != offset:
                problems.append(f"offsetof({name}, {f.name}) is {offset}, "
                                f"{cls.__name__}.{f.name} is at {getattr(py, 'offset', None)}")
    return problems


def test_struct_sizes_and_offsets_match_the_compiler(tmp_path):
    layout = compiled_layout(HEADER, tmp_path, _compiler())
    assert layout["rdt_tensor"] == 48  # DLPack's DLTensor, as documented
    assert layout_problems(layout, parse_header(header_text())) == []


# ---------------------------------------------------------------------------
# Each check catches a real mismatch: mutated copies of the header.
# ---------------------------------------------------------------------------

MUTATIONS = [
    # (what changes, old text, new text, words the report must contain)
    ("a renamed field", "int64_t lease_ms;", "int64_t lease_msec;", "rdt_runtime_options"),
    ("a field's type", "int32_t is_owner;", "int64_t is_owner;", "rdt_object_info.is_owner"),
    ("an array's length", "int64_t shape[RDT_MAX_NDIM];", "int64_t shape[RDT_MAX_NDIM + 1];",
     "rdt_tensor_info.shape"),
    ("fields swapped", "  int32_t device_type; /* RDT_DEVICE_* */\n  int32_t device_id;   /* 0 for host memory */",
     "  int32_t device_id;\n  int32_t device_type;", "rdt_device"),
    ("a callback's parameter", "rdt_status (*wait)(void *user_data, void *request, int64_t timeout_ms);",
     "rdt_status (*wait)(void *user_data, void *request, int32_t timeout_ms);", "rdt_transport_vtable.wait"),
    ("a parameter's type", "RDT_API rdt_status rdt_pending_wait(rdt_pending *pending, int64_t timeout_ms);",
     "RDT_API rdt_status rdt_pending_wait(rdt_pending *pending, uint32_t timeout_ms);",
     "rdt_pending_wait: parameter 1"),
    ("a renamed function's parameter", "RDT_API rdt_status rdt_fetch_wait(rdt_pending *fetch, int64_t timeout_ms)",
     "RDT_API rdt_status rdt_fetch_wait(rdt_pending *fetch, int32_t timeout_ms)",
     "rdt_fetch_wait: renamed to rdt_pending_wait in rdt.h, but their signatures differ"),
    ("a return type", "RDT_API uint32_t rdt_abi_version(void);", "RDT_API uint64_t rdt_abi_version(void);",
     "rdt_abi_version: returns"),
    ("a new function", "RDT_API void rdt_bytes_free(void *bytes);",
     "RDT_API void rdt_bytes_free(void *bytes);\nRDT_API void rdt_bytes_clear(void *bytes);",
     "rdt_bytes_clear: declared in rdt.h"),
    ("a status value", "X(RDT_ERR_CLOSED, -14)", "X(RDT_ERR_CLOSED, -15)", "RDT_ERR_CLOSED (-15)"),
    ("a new status", "X(RDT_ERR_CLOSED, -14)", "X(RDT_ERR_CLOSED, -14) X(RDT_ERR_BUSY, -15)", "RDT_ERR_BUSY"),
    ("a constant", "#define RDT_NAME_MAX 63", "#define RDT_NAME_MAX 127", "RDT_NAME_MAX"),
    ("a flag", "#define RDT_TRANSPORT_CAN_ABORT (1u << 1)", "#define RDT_TRANSPORT_CAN_ABORT (1u << 3)",
     "RDT_TRANSPORT_CAN_ABORT"),
]


@pytest.mark.parametrize("what,old,new,reported", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_a_mismatch_is_reported(what, old, new, reported):
    text = header_text()
    assert text.count(old) == 1, f"the mutation {what!r} no longer applies to rdt.h; update it"
    problems = Checker(parse_header(text.replace(old, new))).all_problems()
    assert any(reported in p for p in problems), problems


def test_a_layout_change_is_reported_by_the_compiler(tmp_path):
    # A field inserted in the middle: names differ, and the offsets move.
    text = header_text()
    old = "  int32_t is_owner;"
    assert text.count(old) == 1
    (tmp_path / "rdt.h").write_text(text.replace(old, "  uint32_t flags;\n" + old))
    layout = compiled_layout(tmp_path / "rdt.h", tmp_path, _compiler())
    problems = layout_problems(layout, parse_header(header_text()))
    assert any("sizeof(rdt_object_info)" in p for p in problems), problems
    assert any("offsetof(rdt_object_info, is_owner)" in p for p in problems), problems
