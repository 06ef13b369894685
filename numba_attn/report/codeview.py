"""The code a phase compiles, for ``numba-attn diff NAME --code`` (:mod:`numba_attn.report.diff`).

:func:`strip_to_code`: a source without docstrings, comments, imports and ``@register_phase(...)``
arguments, the ``if`` branches its compile-time constants rule out pruned (the remaining lines are the
author's, as written). :func:`code_units`: the phase's file and the functions and classes it uses from the
family's shared modules (names imported from ``numba_attn.phases.*``, followed a few calls deep), each
specialised to the constants it is called with (``make_register_blocked[skip=True]``).
"""
from __future__ import annotations

import ast
import inspect
import io
import sys
import textwrap
import tokenize
import types

# How many calls deep --code follows a name from the phase's file into the shared modules
FOLLOW_DEPTH = 5
# Modules whose functions are the registry's machinery, not the kernel's code
NOT_FOLLOWED = ("numba_attn.phases.registry", "numba_attn.phases.discovery")


def _is_register_phase(node: ast.expr) -> bool:
    func = node.func if isinstance(node, ast.Call) else node
    return (isinstance(func, ast.Name) and func.id == "register_phase") or \
        (isinstance(func, ast.Attribute) and func.attr == "register_phase")


_UNKNOWN = object()
_CONSTANT_TYPES = (bool, int, str, type(None))
_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Is: lambda a, b: a is b,
            ast.IsNot: lambda a, b: a is not b, ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
            ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b, ast.In: lambda a, b: a in b,
            ast.NotIn: lambda a, b: a not in b}


def _is_constant(value) -> bool:
    if isinstance(value, (tuple, frozenset)):
        return all(isinstance(x, _CONSTANT_TYPES) for x in value)
    return isinstance(value, _CONSTANT_TYPES)


def evaluate(node: ast.expr, constants: dict, used: set | None = None):
    """The value of ``node`` when ``constants`` decide it (names, literals, ``not``, ``and``/``or``,
    comparisons), else ``_UNKNOWN``. ``used`` collects the names read."""
    if isinstance(node, ast.Constant):
        return node.value if _is_constant(node.value) else _UNKNOWN
    if isinstance(node, ast.Name):
        if node.id in constants and used is not None:
            used.add(node.id)
        return constants.get(node.id, _UNKNOWN)
    if isinstance(node, ast.Tuple):
        items = [evaluate(x, constants, used) for x in node.elts]
        return _UNKNOWN if any(x is _UNKNOWN for x in items) else tuple(items)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        value = evaluate(node.operand, constants, used)
        return _UNKNOWN if value is _UNKNOWN else not value
    if isinstance(node, ast.BoolOp):
        for operand in node.values:  # decided only while the operands before are known
            value = evaluate(operand, constants, used)
            if value is _UNKNOWN:
                return _UNKNOWN
            if bool(value) == isinstance(node.op, ast.Or):
                return value
        return value
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        left = evaluate(node.left, constants, used)
        for op, right_node in zip(node.ops, node.comparators):
            right = evaluate(right_node, constants, used)
            if left is _UNKNOWN or right is _UNKNOWN:
                return _UNKNOWN
            try:
                if not _COMPARE[type(op)](left, right):
                    return False
            except TypeError:
                return _UNKNOWN
            left = right
        return True
    return _UNKNOWN


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _scope_nodes(body):
    """The nodes of a scope's statements, not entering the functions and classes defined there."""
    todo = list(body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, _SCOPES):
            todo.extend(node.decorator_list if not isinstance(node, ast.Lambda) else ())
            continue
        todo.extend(ast.iter_child_nodes(node))


def _parameters(node) -> set[str]:
    args = node.args
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    return names | {a.arg for a in (args.vararg, args.kwarg) if a is not None}


class _Pruner:
    """The lines of a function's source without the ``if`` branches its compile-time ``constants`` rule
    out: the branch taken is kept, dedented to the ``if``'s level when it replaces it. A name stays a
    constant in a scope where it is not assigned (nor a parameter of a nested function); one assigned once
    at a scope's top level from constants (``ws = loads == "ws"``) becomes one. ``drop``: 0-based lines
    removed; ``dedent``: line → columns removed; ``retitle``: line → (keyword, new keyword); ``pruned``:
    the nodes removed (their names are not followed); ``at_call``: id of a call → the constants in its
    scope."""

    def __init__(self, lines: list[str], constants: dict, tree: ast.AST, module_constants: dict | None = None):
        self.lines, self.drop, self.dedent, self.retitle, self.pruned = lines, set(), {}, {}, set()
        self.at_call: dict[int, dict] = {}
        self.used: dict = {}  # the constants that decided a branch, with their values
        top = tree.body[0] if isinstance(tree, ast.Module) and len(tree.body) == 1 else None
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = _parameters(top)
            outer = {k: v for k, v in (module_constants or {}).items() if k not in params}
            self.constants = self._scope({**outer, **constants}, top.body)
            for dec in top.decorator_list:
                self._calls(dec, self.constants)
            self._block(top.body, self.constants)
        else:
            self.constants = self._scope({**(module_constants or {}), **constants}, tree.body)
            self._block(tree.body, self.constants)

    def _scope(self, constants: dict, body) -> dict:
        """The constants of a scope: those it does not assign, and those it assigns once from constants."""
        stores: dict[str, int] = {}
        for node in _scope_nodes(body):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                stores[node.id] = stores.get(node.id, 0) + 1
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                stores.update({name: 2 for name in node.names})
            elif isinstance(node, _SCOPES) and not isinstance(node, ast.Lambda):
                stores[node.name] = stores.get(node.name, 0) + 1
        scope = {k: v for k, v in constants.items() if k not in stores}
        for stmt in body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                    and stores.get(stmt.targets[0].id) == 1:
                value = evaluate(stmt.value, scope)
                if value is not _UNKNOWN:
                    scope[stmt.targets[0].id] = value
        return scope

    def _calls(self, node: ast.AST, constants: dict):
        """Record the constants of the calls in ``node`` (its own scope); enter the scopes it defines."""
        for inner in _scope_nodes([node]):
            if isinstance(inner, ast.Call):
                self.at_call[id(inner)] = constants
            elif isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)) and inner is not node:
                nested = self._scope({k: v for k, v in constants.items() if k not in _parameters(inner)},
                                     inner.body)
                self._block(inner.body, nested)
            elif isinstance(inner, ast.Lambda):
                nested = {k: v for k, v in constants.items() if k not in _parameters(inner)}
                self._calls(inner.body, nested)

    def _indent(self, lineno: int) -> int:
        line = self.lines[lineno - 1]
        return len(line) - len(line.lstrip())

    def _remove(self, first: int, last: int, stmts=()):
        self.drop.update(range(first - 1, last))
        for stmt in stmts:
            self.pruned.update(id(n) for n in ast.walk(stmt))

    def _shift(self, stmts, by: int):
        if by > 0 and stmts:
            for i in range(stmts[0].lineno - 1, stmts[-1].end_lineno):
                self.dedent[i] = self.dedent.get(i, 0) + by

    def _block(self, stmts, constants: dict):
        for stmt in stmts:
            if isinstance(stmt, ast.If):
                self._if(stmt, False, constants)
                continue
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for dec in stmt.decorator_list:
                    self._calls(dec, constants)
                for default in (*stmt.args.defaults, *[d for d in stmt.args.kw_defaults if d is not None]):
                    self._calls(default, constants)
                nested = self._scope({k: v for k, v in constants.items() if k not in _parameters(stmt)},
                                     stmt.body)
                self._block(stmt.body, nested)
                continue
            if isinstance(stmt, ast.ClassDef):
                self._calls(stmt, constants)
                continue
            blocks = [getattr(stmt, f) for f in ("body", "orelse", "finalbody") if getattr(stmt, f, None)]
            blocks += [h.body for h in getattr(stmt, "handlers", ())]
            inner = {id(s) for block in blocks for s in block}
            for node in ast.iter_child_nodes(stmt):  # the statement's own expressions
                if id(node) not in inner and not isinstance(node, ast.excepthandler):
                    self._calls(node, constants)
            for block in blocks:
                self._block(block, constants)

    def _else_line(self, node: ast.If) -> int | None:
        """The line of the ``else:`` (or ``elif``) of ``node``, None without one."""
        if not node.orelse:
            return None
        if self._is_elif(node):
            return node.orelse[0].lineno
        for lineno in range(node.orelse[0].lineno - 1, node.body[-1].end_lineno, -1):
            if self.lines[lineno - 1].lstrip().startswith("else"):
                return lineno
        return None

    def _is_elif(self, node: ast.If) -> bool:
        return len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If) and \
            self.lines[node.orelse[0].lineno - 1].lstrip().startswith("elif")

    def _if(self, node: ast.If, elif_: bool, constants: dict):
        value = _UNKNOWN
        used: set = set()
        if node.body[0].lineno > node.lineno:  # not ``if x: y`` on one line
            value = evaluate(node.test, constants, used)
        else_line = self._else_line(node)
        if node.orelse and else_line is None:
            value = _UNKNOWN
        if value is _UNKNOWN:
            self._calls(node.test, constants)
            self._block(node.body, constants)
            if self._is_elif(node):
                self._if(node.orelse[0], True, constants)
            else:
                self._block(node.orelse, constants)
            return
        self.pruned.update(id(n) for n in ast.walk(node.test))
        self.used.update({name: constants[name] for name in used})
        indent = self._indent(node.lineno)
        if value:
            if else_line is not None:
                self._remove(else_line, node.end_lineno, node.orelse)
            if elif_:  # ``if a: … elif flag: B else: C`` → ``if a: … else: B``
                self._remove(node.lineno + 1, node.body[0].lineno - 1)
                self.retitle[node.lineno - 1] = ("elif" + self.lines[node.lineno - 1].lstrip()[4:], "else:")
            else:
                self._remove(node.lineno, node.body[0].lineno - 1)
                self._shift(node.body, self._indent(node.body[0].lineno) - indent)
            self._block(node.body, constants)
            return
        last = else_line - 1 if else_line is not None else node.end_lineno
        self._remove(node.lineno, last, node.body)
        if not node.orelse:
            return
        if self._is_elif(node):
            if not elif_:  # ``if flag: A elif b: B`` → ``if b: B``
                self.retitle[else_line - 1] = ("elif", "if")
            self._if(node.orelse[0], elif_, constants)
        elif elif_:  # ``if a: … elif flag: B else: C`` → ``if a: … else: C``
            self._block(node.orelse, constants)
        else:  # ``if flag: A else: C`` → ``C``
            self._remove(else_line, else_line)
            self._shift(node.orelse, self._indent(node.orelse[0].lineno) - indent)
            self._block(node.orelse, constants)


def strip_to_code(source: str, constants: dict | None = None) -> str:
    """``source`` without docstrings, comments, imports, blank runs and ``@register_phase(...)`` arguments;
    the other lines as written. ``constants`` (name → value, the compile-time options it is called with):
    the branches of ``if`` statements they decide are pruned (see :class:`_Pruner`)."""
    return _specialise(source, constants or {})[0]


def _specialise(source: str, constants: dict, module_constants: dict | None = None):
    """(code text, tree, the pruner) of ``source`` under ``constants``: :func:`strip_to_code`'s work."""
    source = textwrap.dedent(source)
    lines = source.splitlines()
    drop: set[int] = set()  # 0-based line numbers
    replace: dict[int, str] = {}
    tree = ast.parse(source)
    pruner = _Pruner(lines, constants, tree, module_constants)
    drop |= pruner.drop
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                drop.update(range(body[0].lineno - 1, body[0].end_lineno))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            drop.update(range(node.lineno - 1, node.end_lineno))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for dec in node.decorator_list:
                if _is_register_phase(dec) and dec.end_lineno > dec.lineno:
                    indent = lines[dec.lineno - 1][:len(lines[dec.lineno - 1]) - len(lines[dec.lineno - 1].lstrip())]
                    replace[dec.lineno - 1] = f"{indent}@register_phase(...)"
                    drop.update(range(dec.lineno, dec.end_lineno))
    cut: dict[int, int] = {}  # line → column where its comment starts
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            cut[tok.start[0] - 1] = tok.start[1]
    out: list[str] = []
    for i, line in enumerate(lines):
        if i in drop:
            continue
        line = replace.get(i, line)
        if i in cut:
            line = line[:cut[i]].rstrip()
            if not line.strip():
                continue
        if i in pruner.retitle:  # "elif" → "if" or "else" when the branches before it are pruned
            old_kw, new_kw = pruner.retitle[i]
            stripped = line.lstrip()
            line = line[:len(line) - len(stripped)] + new_kw + stripped[len(old_kw):]
        if pruner.dedent.get(i):
            line = line[min(pruner.dedent[i], len(line) - len(line.lstrip())):]
        if not line.strip() and (not out or not out[-1].strip()):
            continue
        out.append(line.rstrip())
    while out and not out[-1].strip():
        out.pop()
    return ("\n".join(out) + "\n" if out else ""), tree, pruner


def _walk(tree: ast.AST, pruned: set):
    """``ast.walk`` that does not enter the statements a pruner removed."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if id(node) in pruned:
            continue
        yield node
        todo.extend(reversed(list(ast.iter_child_nodes(node))))


def _chain(node: ast.AST) -> tuple[str, ...] | None:
    """``a``, ``a.b``, ``a.b.c`` of a name or attribute node, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return (node.id, *reversed(parts)) if isinstance(node, ast.Name) else None


def _followed(obj) -> bool:
    mod = getattr(obj, "__module__", "") or ""
    return mod.startswith("numba_attn.phases.") and mod not in NOT_FOLLOWED


def _resolve(namespace: dict, chain: tuple[str, ...]):
    obj = namespace.get(chain[0])
    for attr in chain[1:]:
        if not isinstance(obj, types.ModuleType):
            break
        obj = getattr(obj, attr, None)
    return obj


def _function_of(obj):
    """The Python function or class behind ``obj`` (a cached factory, a numba dispatcher) when it belongs to
    the package's phase modules, else None."""
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if getattr(obj, "py_func", None) is not None:  # a numba dispatcher
        obj = obj.py_func
    if not (inspect.isfunction(obj) or inspect.isclass(obj)) or not _followed(obj):
        return None
    return obj


def _module_constants(namespace: dict) -> dict:
    """The module-level names of plain constant values (flags, sizes, names)."""
    return {k: v for k, v in namespace.items() if not k.startswith("__") and _is_constant(v)}


def _argument(node: ast.expr, caller: dict, namespace: dict):
    """A call's argument as a constant, or as a function of the package's phase modules (a factory passed to
    another: its calls there are followed with their constants), else ``_UNKNOWN``."""
    value = evaluate(node, caller)
    if value is not _UNKNOWN:
        return value
    chain = _chain(node)
    if chain:
        obj = caller.get(chain[0]) if len(chain) == 1 and chain[0] in caller else _resolve(namespace, chain)
        func = _function_of(obj)
        if func is not None and inspect.isfunction(func):
            return func
    return _UNKNOWN


def _call_constants(call: ast.Call, func, caller: dict, namespace: dict) -> dict:
    """The parameters of ``func`` that ``call`` binds to constants (literals, the caller's constants, the
    defaults of parameters it does not pass) or to functions of the phase modules."""
    if inspect.isclass(func) or any(isinstance(a, ast.Starred) for a in call.args) \
            or any(kw.arg is None for kw in call.keywords):
        return {}
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return {}
    bound, passed = {}, set()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for param, arg in zip(positional, call.args):
        passed.add(param.name)
        value = _argument(arg, caller, namespace)
        if value is not _UNKNOWN:
            bound[param.name] = value
    for kw in call.keywords:
        passed.add(kw.arg)
        value = _argument(kw.value, caller, namespace)
        if value is not _UNKNOWN:
            bound[kw.arg] = value
    for param in params:
        if param.name not in passed and param.default is not param.empty and _is_constant(param.default):
            bound[param.name] = param.default
    return bound


def _shown(value) -> str:
    return value.__name__ if inspect.isfunction(value) else repr(value)


def _identity(func, bound: dict) -> tuple:
    return (func.__module__, func.__qualname__, tuple(sorted((k, _shown(v)) for k, v in bound.items())))


_SPECIALISED: dict = {}  # (source, module, constants) → (_specialise's result, what keeps the keys' objects alive)


def _constant_key(value):
    return (type(value).__name__, value) if isinstance(value, _CONSTANT_TYPES + (float,)) else ("id", id(value))


def _specialised(source: str, bound: dict, module, own: bool = False):
    """:func:`_specialise` of ``source`` (a function of ``module``, or the module itself: ``own``) under ``bound``,
    once per process: the phases of a family follow the same shared functions under the same constants."""
    key = (source, id(module), own, tuple(sorted((k, _constant_key(v)) for k, v in bound.items())))
    hit = _SPECIALISED.get(key)
    if hit is None:
        consts = None if own else _module_constants(vars(module))
        hit = _SPECIALISED[key] = (_specialise(source, bound, consts), dict(bound), module)
    return hit[0]


def code_units(phase, depth: int = FOLLOW_DEPTH, own: bool = False) -> dict[str, str]:
    """{unit: code} of what ``phase`` compiles: its file (unit ``""``), and every function or class of the
    package's other phase modules its file uses, followed ``depth`` calls deep. A function called with
    compile-time constants (literals, constant defaults, constants of its caller) is shown with the ``if``
    branches they rule out pruned, once per set of constants that decides its branches (unit
    ``module:qualname[name=value, ...]``); else as written (unit ``module:qualname``). ``own``: the functions
    of the phase's file too (when the other side of the diff calls them: a phase that reuses its parent's
    factory)."""
    module = sys.modules[phase.module]
    text, tree, pruner = _specialised(inspect.getsource(module), {}, module, own=True)
    units = {"": text}
    done: set[tuple] = set()
    todo = [(vars(module), tree, pruner.pruned, {}, _module_constants(vars(module)), 0, "")]
    while todo:  # breadth first; constants: at each call, its scope's (else those of the whole unit)
        namespace, tree, pruned, at_call, constants, level, unit = todo.pop(0)
        if level >= depth:
            continue
        calls = {id(n.func): n for n in _walk(tree, pruned) if isinstance(n, ast.Call)}
        found: list[tuple] = []
        for node in _walk(tree, pruned):
            chain = _chain(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            if not chain:
                continue
            call = calls.get(id(node))
            scope = at_call.get(id(call), constants) if call is not None else constants
            passed = scope.get(chain[0]) if len(chain) == 1 else None  # a factory given as an argument
            func = _function_of(passed if inspect.isfunction(passed) else _resolve(namespace, chain))
            if func is None or (func.__module__ == phase.module and not own):
                continue
            found.append((func, _call_constants(call, func, scope, namespace) if call is not None else {}))
        for func, bound in found:
            if _identity(func, bound) in done:
                continue
            done.add(_identity(func, bound))
            try:
                source = inspect.getsource(func)
            except (OSError, TypeError):
                continue
            text, tree, pruner = _specialised(source, bound, sys.modules[func.__module__])
            key = f"{func.__module__}:{func.__qualname__}"
            if pruner.used:
                key += "[" + ", ".join(f"{k}={_shown(v)}" for k, v in sorted(pruner.used.items())) + "]"
            if key == unit:
                continue
            units[key] = text
            todo.append((vars(sys.modules[func.__module__]), tree, pruner.pruned, pruner.at_call, pruner.constants,
                         level + 1, key))
    return units
