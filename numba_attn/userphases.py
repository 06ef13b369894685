"""Your own phases, outside the package.

A phase of your own is a Python file that registers it (``@register_phase``), kept wherever you like:

    numba-attn new smem_kv_nobar --from smem_kv --dir my_phases/   # the parent's module, renamed, and its test
    NUMBA_ATTN_BACKEND=simulator pytest my_phases/test_smem_kv_nobar.py
    numba-attn run --setup my_phases/smem_kv_nobar.py --phases smem_kv,smem_kv_nobar
    numba-attn diff smem_kv_nobar --setup my_phases/smem_kv_nobar.py

:func:`new_phase` (``numba-attn new``) writes ``NAME.py`` — the parent's module with its registration
rewritten (name, parent, an order just after the parent's, title and description to write, the builder
renamed, a docstring template: the idea against the parent, the prediction, the verdict) — and
``test_NAME.py``, which checks the phase and its parent against the float64 reference on odd shapes.

The registry finds phases in user files through

* ``--setup PATH`` (``run``, ``bench``, ``tune``, ``list``, ``diff``, ``card``): a ``.py`` file or a
  directory of them, as well as a module name (:func:`numba_attn.measure.isolation.call_setup`);
* the environment variable ``NUMBA_ATTN_PHASES``: ``.py`` files or directories, separated by
  ``os.pathsep``, loaded when the registry loads (in every process: worker processes inherit it); a file
  that fails is reported in ``numba_attn.phases.BROKEN`` (``numba-attn list`` prints it), not raised;
* the entry-point group ``numba_attn.phases`` of installed distributions (each one a module to import;
  ``module:function`` also calls the function);
* :func:`load_phases` from Python (a notebook): it returns the phases the file registered. Worker
  processes started afterwards (rows with a time limit, ``workers=``) load the same files first.

A file is imported as the module ``numba_attn_user.<file stem>`` (stable: the same in every process;
a second file of the same stem gets a suffix from its path's hash). Loading a file again re-runs it when it
changed (or when its phases were unregistered), so an edited phase replaces the old one. In a directory,
files whose name starts with ``_`` or ``test_`` (the tests ``new`` writes), ``conftest.py`` and
``setup.py`` are not phases and are skipped.
"""
from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import keyword
import os
import re
import sys
from dataclasses import dataclass, field

ENV_VAR = "NUMBA_ATTN_PHASES"  # (numba_attn.phases.discovery reads it; this module imports the registry lazily)

# what load_phases() loaded in this process (absolute paths, module names): worker processes load them too
_EXPLICIT: list[str] = []


class NewPhaseError(ValueError):
    """``numba-attn new`` / :func:`new_phase` refused its arguments (the message names the argument)."""


# --------------------------------------------------------------------------------------------- loading

def _registry():
    from numba_attn.phases import registry

    registry.load_all()
    return registry


def _discovery():
    from numba_attn.phases import discovery

    return discovery


def is_path_spec(spec: str) -> bool:
    """Whether a ``--setup`` / :func:`load_phases` argument names a file or directory (else a module)."""
    return _discovery().is_path_spec(spec)


def load_spec(spec: str, given: str | None = None):
    """``(module or None, phases)`` of a ``.py`` file, a directory of them or a module name, registered."""
    return _registry().load_spec(spec, given)


def load_phases(path_or_module) -> list:
    """Register the phases of a ``.py`` file, of every ``.py`` file of a directory (files named ``_*`` or
    ``test_*`` left out), or of a module (name), and return them (:class:`~numba_attn.phases.registry.Phase`
    objects). A file is imported as ``numba_attn_user.<stem>``; loading it again re-runs it only when it
    changed, its new phases replacing the old. Errors (a missing file, an exception in the file, a name
    already taken by another module) are raised, and nothing of a failing file stays registered. Worker
    processes started afterwards by this process load the same files before their first row."""
    spec = os.fspath(path_or_module)
    _, phases = load_spec(spec)
    if not is_path_spec(spec):
        keys = [spec]
    elif os.path.isdir(spec):
        keys = [os.path.abspath(f) for f in _discovery().phase_files(spec)]
    else:
        keys = [os.path.abspath(spec)]
    _EXPLICIT.extend(k for k in keys if k not in _EXPLICIT)
    return phases


def worker_specs() -> tuple:
    """What :func:`load_phases` loaded in this process, for worker processes: module names, and the
    absolute paths of the files whose phases are still registered (not those of a ``temporary_phases``
    block that ended)."""
    from numba_attn.phases.registry import registered

    def live(key):
        info = _discovery().FILES.get(key)
        if info is None:
            return True  # a module name
        return any(getattr(registered(n), "module", None) == info["module"] for n in info["phases"])

    return tuple(k for k in _EXPLICIT if live(k))


def split_setup(spec: str) -> tuple[str, str]:
    """``("target", "function")`` of a ``--setup`` spec ``target[:function]`` (target: module, file or directory)."""
    head, sep, tail = spec.rpartition(":")
    if sep and head and tail.isidentifier():
        return head, tail
    return spec, ""


def absolute_setup(spec: str) -> str:
    """A ``--setup`` spec with a relative path made absolute (worker processes may start elsewhere)."""
    target, fn = split_setup(spec)
    if is_path_spec(target):
        return os.path.abspath(target) + (f":{fn}" if fn else "")
    return spec


def shown_path(path: str) -> str:
    """A phase file as people read it: relative to the repository inside it, else the path as it was
    given when the file was loaded (else the absolute path)."""
    if not path:
        return ""
    from numba_attn.report.records import ROOT

    ab = os.path.abspath(path)
    if os.path.commonpath([ab, ROOT]) == ROOT:
        return os.path.relpath(ab, ROOT).replace(os.sep, "/")
    info = _discovery().FILES.get(ab) if "numba_attn.phases.discovery" in sys.modules else None
    return info["given"] if info else ab


def out_of_tree(phase) -> bool:
    """A phase registered from a user file or module (not a phase of the package)."""
    return not phase.is_builtin


# ------------------------------------------------------------------------------------------ new_phase

@dataclass
class NewPhase:
    """What :func:`new_phase` wrote."""

    name: str
    parent: str
    order: float
    phase_file: str
    test_file: str
    parent_file: str
    factory: str = ""  # the family module holding the parent's kernel, when the parent's module has none
    factory_names: list = field(default_factory=list)

    def __str__(self):
        return self.summary()

    def summary(self) -> str:
        pf, tf = _short(self.phase_file), _short(self.test_file)
        w = max(len(pf), len(tf))
        lines = [f"wrote {pf.ljust(w)}  the phase {self.name}: {self.parent}'s module ({self.parent_file}), registered "
                 f"as {self.name} (order {self.order:g}, parent {self.parent})",
                 f"wrote {tf.ljust(w)}  its test: {self.name} and {self.parent} against the float64 reference "
                 f"on odd shapes (simulator)"]
        if self.factory:
            names = ", ".join(self.factory_names) or "its factory"
            lines += ["", f"note: {self.parent} keeps its kernel in {self.factory}; {pf} calls it ({names}) and runs "
                          f"as is. To change the kernel, copy the factory from {self.factory} into {pf} and call "
                          f"your copy."]
        lines += ["", "next:",
                  f"  1. edit {pf}: the docstring (idea, prediction, verdict), title, description, then the kernel",
                  f"  2. pytest {tf}",
                  f"  3. numba-attn run --setup {pf} --phases {self.parent},{self.name}   "
                  f"(a problem: -N 4096 -D 64 ...; in the simulator a tiny one: --simulator -N 37 --kv-len 53 -D 16)",
                  f"  4. numba-attn diff {self.name} --setup {pf}",
                  f"(or export {ENV_VAR}={_short(os.path.dirname(self.phase_file))}: every command, notebook and "
                  f"worker process then finds the phases of that directory)"]
        return "\n".join(lines) + "\n"


def _short(path: str) -> str:
    """``path`` relative to the current directory when inside it (``./x.py`` for a file there), else as is."""
    rel = os.path.relpath(path)
    if rel == ".":
        return "."
    return path if rel.startswith("..") else (rel if os.sep in rel else os.path.join(".", rel))


def _is_register_phase(dec) -> bool:
    f = dec.func if isinstance(dec, ast.Call) else None
    return (isinstance(f, ast.Name) and f.id == "register_phase") or (
        isinstance(f, ast.Attribute) and f.attr == "register_phase")


def _is_kernel_decorator(dec) -> bool:
    f = dec.func if isinstance(dec, ast.Call) else dec
    if isinstance(f, ast.Name):
        return f.id in ("kernel", "jit")
    if isinstance(f, ast.Attribute):
        return f.attr in ("kernel", "jit")
    return False


def _kw(call: ast.Call, name: str):
    return next((k for k in call.keywords if k.arg == name), None)


def _free_order(parent_order: float, taken) -> float:
    above = [o for o in taken if o > parent_order]
    gap = min(min(above) - parent_order, 1.0) if above else 1.0
    order = parent_order + gap / 2
    return float(f"{order:.6g}")


DOC_TEMPLATE = '''"""``{name}`` — TODO: the idea, in one line.

Change against ``{parent}``: TODO: what this phase does differently from its parent (the
change ``numba-attn diff {name}`` shows), and why that should help.

Prediction (written before measuring): TODO: the expected time or throughput, on which
problem and GPU, against ``{parent}``.

Verdict: TODO: after measuring (``numba-attn run --phases {parent},{name} ...``): the measured
time against the prediction, and the results file it comes from.

Written by ``numba-attn new {name} --from {parent}`` from ``{parent_file}``.
"""'''


def _rewrite(source: str, parent, name: str, order: float, parent_file: str, module: str) -> tuple[str, list]:
    """The parent's module source turned into the new phase's (see :func:`new_phase`); and, when the module
    defines no kernel of its own, ``(names, module)``: the names the builder calls from modules of the phases
    package (factories first) and the module of the first one (None: none found)."""
    tree = ast.parse(source)
    data = source.encode()
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def off(lineno, col):
        return starts[lineno - 1] + col

    edits = []  # (start, end, replacement)

    def replace(node, text):
        edits.append((off(node.lineno, node.col_offset), off(node.end_lineno, node.end_col_offset), text))

    builder = call = None
    others = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for dec in node.decorator_list:
                if _is_register_phase(dec):
                    kw = _kw(dec, "name")
                    if kw is not None and isinstance(kw.value, ast.Constant) and kw.value.value == parent.name:
                        builder, call = node, dec
                    else:
                        others.append(ast.unparse(kw.value) if kw is not None else "?")
    if builder is None:
        raise NewPhaseError(f"--from {parent.name}: its module ({parent_file}) has no @register_phase(name="
                            f"\"{parent.name}\") builder to copy (a register_variant of another phase? copy that one)")
    if others:
        raise NewPhaseError(f"--from {parent.name}: its module ({parent_file}) registers other phases too "
                            f"({', '.join(others)}); copy a module that registers one phase")
    # the registration
    kw_name = _kw(call, "name")
    replace(kw_name.value, f'"{name}"')
    kw_order = _kw(call, "order")
    if kw_order is not None:
        replace(kw_order.value, repr(order))
    kw_parent = _kw(call, "parent")
    if kw_parent is not None:
        replace(kw_parent.value, f'"{parent.name}"')
    else:
        end = off(kw_name.value.end_lineno, kw_name.value.end_col_offset)
        edits.append((end, end, f', parent="{parent.name}"'))
    kw_title = _kw(call, "title")
    if kw_title is not None:
        replace(kw_title.value, f'"TODO: the title of {name} (what changes against {parent.name})"')
    kw_desc = _kw(call, "description")
    if kw_desc is not None:
        ind = " " * kw_desc.col_offset
        replace(kw_desc.value, f'"""\n{ind}    TODO: the idea of {name} against {parent.name}, in two or three '
                               f'sentences\n{ind}    (`numba-attn list -v` and the phase\'s card show them).\n{ind}"""')
    # the builder's name (``def PARENT(problem, ...)`` → ``def NAME(...)``)
    def_line = data[starts[builder.lineno - 1]:starts[builder.lineno]].decode()
    m = re.search(rf"\bdef\s+({re.escape(builder.name)})\b", def_line)
    if m:
        col = len(def_line[:m.start(1)].encode())
        edits.append((off(builder.lineno, col), off(builder.lineno, col + len(builder.name.encode())), name))
    # the module docstring
    doc = DOC_TEMPLATE.format(name=name, parent=parent.name, parent_file=parent_file)
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        replace(first, doc)
    else:
        edits.append((0, 0, doc + "\n"))
    # relative imports → absolute ones (the copy runs from anywhere)
    package = module.rpartition(".")[0]
    factory_names = []
    has_kernel = False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            target = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            seg = data[off(node.lineno, node.col_offset):off(node.end_lineno, node.end_col_offset)].decode()
            new = re.sub(r"^from\s+\.+[\w.]*", f"from {target}", seg, count=1)
            replace(node, new)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                _is_kernel_decorator(d) for d in node.decorator_list):
            has_kernel = True
        if isinstance(node, ast.Call) and _is_kernel_decorator(node.func):  # kernel(fn), cuda.jit(...)(fn)
            has_kernel = True
    factory_module = None
    if not has_kernel:
        shared = {}  # name -> the module of the phases package it is imported from
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod_name = importlib.util.resolve_name("." * node.level + (node.module or ""), package) \
                    if node.level else (node.module or "")
                if mod_name.startswith("numba_attn.phases.") and mod_name != "numba_attn.phases.registry":
                    shared.update({a.asname or a.name: mod_name for a in node.names})
        called = [n.func.id for n in ast.walk(builder) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
        factory_names = [c for c in dict.fromkeys(called) if c in shared]
        factory_names.sort(key=lambda c: 0 if c.startswith(("make_", "build_")) else 1 if "launch" in c else 2)
        factory_module = shared[factory_names[0]] if factory_names else None
    for (s1, e1, _), (s2, e2, _) in zip(sorted(edits), sorted(edits)[1:]):
        if s2 < e1:
            raise NewPhaseError(f"--from {parent.name}: overlapping rewrites of its module ({parent_file})")
    for s, e, text in sorted(edits, reverse=True):
        data = data[:s] + text.encode() + data[e:]
    out = data.decode()
    ast.parse(out)  # still Python
    return out, ((factory_names, factory_module) if not has_kernel else None)


# Odd shapes (lengths no multiple of a tile, q_len != kv_len), as in tests/test_phases.py: the source of
# each problem. A new phase's test keeps those its parent supports (with its sim_params).
TEST_SHAPES = {
    "B1H2-37x53-D16-fp32": "na.Problem(batch=1, heads=2, q_len=37, kv_len=53, head_dim=16)",
    "B1H2-37x53-D16-fp32-causal": "na.Problem(batch=1, heads=2, q_len=37, kv_len=53, head_dim=16, causal=True)",
    "B2H2/1-29-D32-fp16-causal": ("na.Problem(batch=2, heads=2, kv_heads=1, q_len=29, head_dim=32, dtype=\"float16\", "
                                  "causal=True)"),
    "B1H2-19x45-D32-fp16": "na.Problem(batch=1, heads=2, q_len=19, kv_len=45, head_dim=32, dtype=\"float16\")",
    "decode-B2H4/2-1x45-D32-fp32": "na.Problem(batch=2, heads=4, kv_heads=2, q_len=1, kv_len=45, head_dim=32)",
    "decode-B1H2-3x45-D16-fp16-causal": ("na.Problem(batch=1, heads=2, q_len=3, kv_len=45, head_dim=16, "
                                         "dtype=\"float16\", causal=True)"),
    "decode-B1H4/1-2x45-D16-fp16": ("na.Problem(batch=1, heads=4, kv_heads=1, q_len=2, kv_len=45, head_dim=16, "
                                    "dtype=\"float16\")"),
    "paged-B2H4/2-1x45-D16-fp16-P16-ragged": ("PagedProblem(batch=2, heads=4, kv_heads=2, q_len=1, kv_len=45, "
                                              "head_dim=16, dtype=\"float16\", page_size=16, ragged=True)"),
    "paged-B1H2-3x45-D32-fp16-P32-causal": ("PagedProblem(batch=1, heads=2, q_len=3, kv_len=45, head_dim=32, "
                                            "dtype=\"float16\", page_size=32, causal=True)"),
    "varlen-B3H4/2-21x25-D16-fp16-causal": ("VarlenProblem(batch=3, heads=4, kv_heads=2, q_len=21, kv_len=25, "
                                            "head_dim=16, dtype=\"float16\", causal=True)"),
    "varlen-B2H2-19-D32-fp16": "VarlenProblem(batch=2, heads=2, q_len=19, head_dim=32, dtype=\"float16\")",
}

TEST_TEMPLATE = '''"""The test of ``{name}`` (written by ``numba-attn new {name} --from {parent}``).

``{name}`` and its parent ``{parent}`` against the float64 reference, in the Numba CUDA simulator
unless NUMBA_ATTN_BACKEND says otherwise, on odd shapes (lengths that are no multiple of a tile,
q_len != kv_len) with each phase's small simulator tiles (its ``sim_params``). A row is OK when the
output (poisoned first) matches the reference within the dtype's tolerance, every element written.

    pytest {test_file}
"""
import os
from pathlib import Path

os.environ.setdefault("NUMBA_ATTN_BACKEND", "simulator")  # chosen before numba_attn imports numba

import pytest  # noqa: E402

import numba_attn as na  # noqa: E402
{extra_import}
NAME, PARENT = "{name}", "{parent}"
PHASES = na.load_phases(str(Path(__file__).with_name("{name}.py")))  # registers {name}

SHAPES = {{
{shapes}
}}


def _row(phase, problem):
    params = na.get_phase(phase).sim_params
    rows = na.run([phase], [problem], seeds=(7,), params={{phase: params}}, peers=False)
    return next(r for r in rows if r.get("type") == "result")


def test_the_file_registers_the_phase():
    assert NAME in [p.name for p in PHASES]
    assert na.get_phase(NAME).parent == PARENT


def test_the_phase_runs_some_shape():
    phase = na.get_phase(NAME)
    params = phase.resolve_params(phase.sim_params)
    assert any(phase.supports(p, **params) is None for p in SHAPES.values()), \\
        f"{{NAME}} supports none of the test shapes: add one it runs"


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("phase", [PARENT, NAME])
def test_matches_the_reference(phase, shape):
    row = _row(phase, SHAPES[shape])
    if row["status"] == "SKIP":
        pytest.skip(f"{{phase}} does not run {{shape}}: {{row['reason']}}")
    assert row["status"] == "OK", f"{{phase}} on {{shape}}: {{row['status']}}: {{row.get('reason')}}"
    assert row["check"]["rel_err"] <= row["check"]["tol"]
    assert row["check"]["unwritten"] == 0
'''


def _test_shapes(parent) -> dict:
    from numba_attn.spec.problem import PagedProblem, VarlenProblem  # noqa: F401  (eval below)
    import numba_attn as na  # noqa: F401

    params = parent.resolve_params(parent.sim_params)
    ok = {}
    for label, src in TEST_SHAPES.items():
        try:
            problem = eval(src, {"na": na, "PagedProblem": PagedProblem, "VarlenProblem": VarlenProblem})  # noqa: S307
        except Exception:  # noqa: BLE001 - an optional dtype's problem
            continue
        if parent.supports(problem, **params) is None:
            ok[label] = src
    if not ok:  # the parent runs none of them in the simulator: keep those of its layout
        ok = {k: v for k, v in TEST_SHAPES.items()
              if {"paged": k.startswith("paged"), "varlen": k.startswith("varlen")}.get(
                  parent.layout, not k.startswith(("paged", "varlen")))}
    prefer = [k for k in ok if k.startswith("decode") == (parent.kind == "decode")]
    keep = (prefer + [k for k in ok if k not in prefer])[:4]
    return {k: ok[k] for k in TEST_SHAPES if k in keep}


def new_phase(name: str, from_: str, dir: str | None = None) -> NewPhase:  # noqa: A002 - the CLI's --dir
    """Write ``DIR/NAME.py`` and ``DIR/test_NAME.py`` (``numba-attn new NAME --from PARENT --dir DIR``).

    ``NAME.py`` is the module of phase ``from_`` (the parent: its kernel code, ready to change) with the
    registration rewritten: ``name=NAME``, ``parent=PARENT``, an order just after the parent's (a free one),
    title and description marked TODO, the builder renamed ``NAME``, a docstring template (the idea against
    the parent, the prediction, the verdict), relative imports made absolute. ``test_NAME.py`` checks NAME
    and the parent against the float64 reference on odd shapes the parent runs, with their ``sim_params``.
    ``dir``: default the current directory (created when missing). Nothing is registered: load the file
    with :func:`load_phases` (or ``--setup``, ``$NUMBA_ATTN_PHASES``).

    Refused with :class:`NewPhaseError` (naming the argument): NAME not an identifier, already a phase or
    an importable module, a file of that name in DIR, an unknown parent (close names suggested)."""
    registry = _registry()
    directory = os.path.abspath(os.path.expanduser(dir if dir is not None else os.getcwd()))
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise NewPhaseError(f"NAME {name!r} is not a Python identifier (letters, digits and _, not starting with "
                            f"a digit): it names the phase, its builder and its file")
    if name.startswith("test_"):
        raise NewPhaseError(f"NAME {name!r}: a name starting with test_ is taken for tests (the directory "
                            f"loaders skip such files)")
    if registry.registered(name) is not None:
        ph = registry.registered(name)
        raise NewPhaseError(f"NAME {name!r} is already a phase (order {ph.order:g}, "
                            f"{shown_path(ph.source_file) or ph.module}); choose another name")
    phase_file = os.path.join(directory, f"{name}.py")
    test_file = os.path.join(directory, f"test_{name}.py")
    for path in (phase_file, test_file):
        if os.path.exists(path):
            raise NewPhaseError(f"--dir {_short(directory)}: {os.path.basename(path)} exists there; choose another "
                                f"NAME or directory (new never overwrites a file)")
    try:
        importable = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a module in sys.modules without a spec (numba_attn_user)
        importable = True
    if name in sys.builtin_module_names or name in getattr(sys, "stdlib_module_names", ()) or importable:
        raise NewPhaseError(f"NAME {name!r} is the name of an importable module: {name}.py would shadow it "
                            f"next to its test; choose another name")
    parent = registry.registered(from_) if isinstance(from_, str) else None
    if parent is None:
        known = [p.name for p in registry.list_phases()]
        close = difflib.get_close_matches(str(from_), known, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise NewPhaseError(f"--from {from_!r} is not a phase.{hint} (`numba-attn list` names them all)")
    if parent.kind == "backward":  # its test template runs forward launches (numba_attn.run)
        raise NewPhaseError(f"--from {from_!r} is a backward phase: new copies forward phases only; copy its module "
                            f"(numba_attn/phases/backward/) by hand and check it with numba_attn.backward.check_backward")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise NewPhaseError(f"--dir {_short(directory)}: not a directory")
    src_path = parent.source_file
    if not src_path or not os.path.isfile(src_path):
        raise NewPhaseError(f"--from {from_!r}: its module ({parent.module}) has no source file to copy")
    with open(src_path, encoding="utf-8") as f:
        source = f.read()
    order = _free_order(parent.order, {p.order for p in registry.list_phases()})
    parent_file = shown_path(src_path)
    text, factory = _rewrite(source, parent, name, order, parent_file, parent.module)
    shapes = _test_shapes(parent)
    extra = [c for c in ("PagedProblem", "VarlenProblem") if any(s.startswith(c) for s in shapes.values())]
    test = TEST_TEMPLATE.format(
        name=name, parent=parent.name, test_file=f"test_{name}.py",
        extra_import=(f"from numba_attn.spec.problem import {', '.join(extra)}  # noqa: E402\n" if extra else ""),
        shapes="\n".join(f"    {label!r}: {src}," for label, src in shapes.items()))
    ast.parse(test)
    os.makedirs(directory, exist_ok=True)
    for path, body in ((phase_file, text), (test_file, test)):
        with open(path, "x", encoding="utf-8") as f:
            f.write(body)
    factory_names, factory_module = factory if factory is not None else ([], None)
    factory_file = ""
    if factory is not None and factory_module is None:  # no shared name found: the family's package
        factory_file = parent.module.rpartition(".")[0].replace(".", "/") + "/"
    elif factory is not None:
        loaded = sys.modules.get(factory_module)
        factory_file = shown_path(loaded.__file__) if getattr(loaded, "__file__", None) else \
            factory_module.replace(".", "/") + ".py"
    return NewPhase(name=name, parent=parent.name, order=order, phase_file=phase_file, test_file=test_file,
                    parent_file=parent_file, factory=factory_file, factory_names=list(factory_names))
