"""Results files: JSON lines, appended and flushed one record at a time, read back for reports and resume.

A file holds one ``env`` record per run (environment, commit, source hash, command), ``ceiling``
records, then ``result`` rows. ``task_key``/``row_key`` give a row's identity (what was run, on
what, with which requested parameters and seeds, and the hash of the phase module's source), so
that a resumed run skips the OK rows a file already holds for the same package source and
environment (``env_key``) and runs again every row that failed, timed out or was skipped.

Reading a file checks it: a line that is not UTF-8, valid JSON that is not an object, JSON nested
too deeply, or a field of the wrong type (``time_ms`` a string, ``problem`` not an object, a row
of a phase without its ``problem``) raises :class:`~numba_attn.spec.errors.ResultsFileError`
naming the file and the line. A line cut short by a killed run is skipped.

Writers of one file are serialized by :func:`results_lock`: an exclusive ``fcntl.flock`` on the
sidecar file ``<results>.lock`` held for the whole run (a second run on the same file waits, then
resumes from what the first wrote). On Windows (no ``fcntl``) no lock is taken: do not run two
writers on one file there.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os

import numpy as np

from numba_attn.spec.errors import ResultsFileError
from numba_attn.spec.problem import Problem

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


class ResultsWriter:
    """Appends JSON lines and flushes each one, so an interrupted run leaves a valid file."""

    def __init__(self, path: str | None):
        self.path = path
        if path:
            check_writable(path)
            try:
                # a previous run killed mid-line: end that line so the next record starts clean
                if os.path.isfile(path) and os.path.getsize(path) > 0:
                    with open(path, "rb") as f:
                        f.seek(-1, os.SEEK_END)
                        last = f.read(1)
                    if last != b"\n":
                        with open(path, "a", encoding="utf-8") as f:
                            f.write("\n")
            except OSError as exc:
                raise ResultsFileError(path, f"cannot write the results file: {exc.strerror or exc}") from None

    def write(self, record: dict):
        if not self.path:
            return
        line = json.dumps(record, default=json_default, allow_nan=True) + "\n"
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:  # full disk, removed directory, permissions
            raise ResultsFileError(self.path, f"cannot write the results file: {exc.strerror or exc}") from None


def check_writable(path: str) -> None:
    """Refuse a results path that cannot be appended to, before anything runs."""
    if os.path.isdir(path):
        raise ResultsFileError(path, "is a directory; give a results file (e.g. results/run.jsonl)")
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
        existed = os.path.exists(path)
        with open(path, "a", encoding="utf-8"):
            pass
        if not existed:  # a check only: leave no empty file behind
            os.remove(path)
    except OSError as exc:
        raise ResultsFileError(path, f"cannot write the results file: {exc.strerror or exc}") from None


@contextlib.contextmanager
def results_lock(path: str | None, warn=None):
    """Hold an exclusive lock on ``path`` (its sidecar ``<path>.lock``) for the block; waits, after
    a ``warn`` message, while another run holds it. No lock without a path or without ``fcntl``."""
    if not path or fcntl is None:
        yield
        return
    check_writable(path)
    lock_path = path + ".lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ResultsFileError(lock_path, f"cannot create the lock file: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if warn:
                warn(f"another run is writing {path}: waiting for it to finish ({lock_path})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def json_default(o):
    """NumPy scalars as Python numbers; anything else as its ``str``."""
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (np.bool_,)):
        return bool(o)
    return str(o)


_NUMBER_FIELDS = ("time_ms", "flops", "min_bytes", "speedup", "wall_s", "value", "order", "planned_speedup")
_STR_FIELDS = ("type", "status", "phase", "kind", "reason", "label", "gpu", "run_id", "env_key", "name")
_DICT_FIELDS = ("params", "requested_params", "config")
_PROBLEM_INTS = ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim")
MAX_LINE_BYTES = 16 * 2**20  # a line longer than this is not a record the runner wrote


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_record(rec) -> str | None:
    """Why ``rec`` (one parsed line) is not a record of a results file, or None."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object (a record is {{\"type\": ...}})"
    for k in _NUMBER_FIELDS:
        if rec.get(k) is not None and not _is_number(rec[k]):
            return f"field {k!r} must be a number, got {rec[k]!r:.60}"
    for k in _STR_FIELDS:
        if rec.get(k) is not None and not isinstance(rec[k], str):
            return f"field {k!r} must be a string, got {rec[k]!r:.60}"
    for k in _DICT_FIELDS:
        if rec.get(k) is not None and not isinstance(rec[k], dict):
            return f"field {k!r} must be an object, got {rec[k]!r:.60}"
    if rec.get("type") == "result" and rec.get("kind") in ("phase", "peer"):
        prob = rec.get("problem")
        if not isinstance(prob, dict):
            return "a result row without its problem" if prob is None else f"field 'problem' must be an object, got {prob!r:.60}"
        for k in _PROBLEM_INTS:
            if k in prob and not (isinstance(prob[k], int) and not isinstance(prob[k], bool)):
                return f"problem field {k!r} must be an integer, got {prob[k]!r:.60}"
        for k in ("q_len", "kv_len", "head_dim"):
            if k not in prob:
                return f"problem without {k!r}"
    return None


def load_results(path: str) -> list[dict]:
    """Every record of a results file; a truncated line (a run killed while writing) is
    skipped, so an interrupted file always loads. Anything else that is not a record raises
    :class:`ResultsFileError` naming the file and the line."""
    if os.path.isdir(path):
        raise ResultsFileError(path, "is a directory, not a results file (JSON lines)")
    out = []
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise ResultsFileError(path, f"cannot read: {exc.strerror or exc}") from None
    with f:
        for no, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                raise ResultsFileError(path, f"not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})",
                                       no) from None
            if not line:
                continue
            if len(line) > MAX_LINE_BYTES:
                raise ResultsFileError(path, f"a line of {len(line)} characters is not a results record", no)
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # cut short by a killed run
            except RecursionError:
                raise ResultsFileError(path, "JSON nested too deeply to be a results record", no) from None
            why = check_record(rec)
            if why:
                raise ResultsFileError(path, why, no)
            out.append(rec)
    return out


def resumable_rows(path: str | None, env_key: str) -> list[dict]:
    """The OK result and ceiling rows of ``path`` measured with the same package source and
    environment; rows that failed, raised, timed out or were skipped are measured again."""
    if not path or not os.path.exists(path):
        return []
    return [r for r in load_results(path) if r.get("type") in ("result", "ceiling")
            and r.get("env_key") == env_key and r.get("status") == "OK"]


def source_hash_of(module_name: str) -> str | None:
    """sha1 (12 hex digits) of a module's source file (a phase's module, package or user's)."""
    import inspect
    import sys

    mod = sys.modules.get(module_name)
    if mod is None:
        return None
    try:
        path = inspect.getsourcefile(mod)
        with open(path, "rb") as f:
            data = f.read()
    except (OSError, TypeError):
        try:
            data = inspect.getsource(mod).encode()
        except (OSError, TypeError):
            return None
    return hashlib.sha1(data).hexdigest()[:12]


def task_key(kind: str, name: str, problem: Problem | dict | None, params: dict | None,
             seeds=None, code: str | None = None, tag: str | None = None) -> str:
    """Identity of a row for ``resume``: what was run (and the hash of its module's source),
    on what, with which parameters and seeds; ``tag``: a repeat of the same task with another
    purpose (a tuning's final round), kept apart from the first measurement."""
    prob = problem.to_dict() if isinstance(problem, Problem) else problem
    seeds = [int(s) for s in seeds] if seeds is not None else None
    key = [kind, name, prob, params or {}, seeds, code] + ([tag] if tag else [])
    return json.dumps(key, sort_keys=True, default=json_default)


def row_key(row: dict) -> str:
    """:func:`task_key` of a recorded row (its requested parameters, not the resolved ones;
    the seeds the run asked for; its phase module's source hash)."""
    if row.get("type") == "ceiling":
        return task_key("ceiling", row.get("name"), None, None)
    params = row.get("requested_params") if "requested_params" in row else None
    return task_key(row.get("kind"), row.get("phase"), row.get("problem"), params,
                    row.get("requested_seeds"), row.get("phase_source_hash"), row.get("round"))
