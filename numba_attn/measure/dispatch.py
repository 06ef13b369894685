"""The dispatch table: the phase and parameters ``attention(phase=None)`` runs, from measurements.

One JSON file in the package (``numba_attn/data/dispatch.json``; ``$NUMBA_ATTN_DISPATCH_TABLE`` names another),
built from committed GPU results files and, when asked, a tuning cache::

    numba-attn dispatch --build [--results FILE ...] [--cache PATH] [--out PATH]
    numba-attn dispatch --show
    numba-attn dispatch --check     (exit 1 when the package's table differs from a rebuild)

**Key**: the tuning cache's (:func:`~numba_attn.measure.tune.cache_key`). **What counts**: every timed ``OK``
phase row of a registered phase and the timed cache entries given; a configuration is a phase and the parameters
the row asked for, read as they ran (:func:`as_ran`: a former default stays its own configuration) and under
today's names (:data:`RENAMED_PARAMS`). **The rule**: configurations are compared only on the problems both were
measured on (one beats another when the geometric mean of their time ratios is below 1), ranked by wins minus
losses, then by score, so problems of different sizes in one key are never compared across. **The entry** keeps
the ranking with each configuration's source row, the configuration ``phase=None`` runs on top (never a
``NEVER_DEFAULT`` phase or one below the input precision, kept with the reason); ``gpus`` lists each GPU model's
compute capability and SM count.

**At run time** (:func:`choose`, called by :func:`numba_attn.measure.policy.choose_phase` after the tuning cache
and a measurement on first use): the first ranked configuration among the candidates that supports the problem
with its parameters. Where the Hopper rule applies, an entry counts only when it measured the rule's phase at its
defaults (:func:`measured_default`); a model without such an entry may take another model's of its compute
capability (:func:`choose_other`). The details: docs/DEVELOPING.md, "Dispatch".
"""
from __future__ import annotations

import glob
import json
import math
import os

from numba_attn.measure.results import load_results
from numba_attn.measure.tune import TuningCache, cache_key
from numba_attn.report.records import commit_of, gpu_of, rel, results_files, with_env
from numba_attn.spec.problem import Problem

TABLE_ENV = "NUMBA_ATTN_DISPATCH_TABLE"
PACKAGE_TABLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "dispatch.json")
SHOWN_PACKAGE_TABLE = "numba_attn/data/dispatch.json"
BUILD_COMMAND = "numba-attn dispatch --build"
VERSION = 1

# Parameter names recorded in older results rows → today's names (the renames of the tensor-core,
# decode and CUDA-core families).
RENAMED_PARAMS = {"W": "warps", "WG": "warpgroups", "STAGES": "stages", "MT": "m_tiles", "MAXREG": "maxreg",
                  "DYN": "dynamic_smem", "LW": "loader_warps"}

RULE = ("per key (GPU, dtype, causal, head_dim, GQA group, q1/prefill, kv_len bucket): each (phase, requested "
        "parameters) keeps its median time per problem; a configuration beats another when the geometric mean of "
        "their time ratios over the problems both were measured on is below 1; ranked by wins minus losses, then "
        "score (geometric mean of its time over the best time on each problem measured with two configurations or "
        "more), then the number of such problems; configurations never measured beside another rank last, by "
        "time. phase: the first configuration that is not excluded (never a default, or below input precision)")

_FIELDS = ("batch", "heads", "q_len", "kv_len", "head_dim", "causal", "dtype", "scale", "kv_heads")


# -- reading measurements ----------------------------------------------------------------------

def table_path() -> str:
    """``$NUMBA_ATTN_DISPATCH_TABLE``, else the package's ``numba_attn/data/dispatch.json``."""
    env = os.environ.get(TABLE_ENV)
    return os.path.expanduser(env) if env else PACKAGE_TABLE


def shown_path(path: str) -> str:
    return SHOWN_PACKAGE_TABLE if os.path.abspath(path) == PACKAGE_TABLE else path


def _shown_file(path) -> str:
    if not path:
        return "?"
    r = rel(path)
    return path if r.startswith("..") else r


def renamed(params) -> dict:
    """``params`` under today's parameter names (:data:`RENAMED_PARAMS`)."""
    return {RENAMED_PARAMS.get(k, k): v for k, v in (params or {}).items()}


def _timed_ok(row) -> bool:
    t = row.get("time_ms")
    return (row.get("type") == "result" and row.get("kind") == "phase" and row.get("status") == "OK"
            and isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 and math.isfinite(t)
            and isinstance(row.get("problem"), dict))


def measured_rows(files=None, gpu: str | None = None, strict: bool = False) -> list[tuple[str, dict | None, dict]]:
    """``(file, env, row)`` for every OK, timed forward phase row of ``files`` (default: the committed
    ``results/*.jsonl`` of a source checkout; backward rows choose no forward phase), measured on ``gpu`` when
    given; each row has its
    ``gpu`` set (from its run's env record when the row lacks it). A file that cannot be read is
    passed over, or with ``strict`` raises (``ResultsFileError``, a ValueError naming the file)."""
    out = []
    for path in (results_files() if files is None else files):
        try:
            records = load_results(path)
        except (OSError, ValueError):
            if strict:
                raise
            continue
        for env, r in with_env(records):
            if not _timed_ok(r) or r.get("phase_kind") == "backward":
                continue
            g = gpu_of(r, env)
            if gpu is not None and g != gpu:
                continue
            out.append((_shown_file(path), env, {**r, "gpu": g}))
    return out


def _problem(d: dict) -> Problem:
    return Problem(**{k: d[k] for k in _FIELDS if k in d})


def _canon(params: dict) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def _config(ph, params) -> dict | None:
    """``params`` renamed, without values equal to the phase's defaults; None when the phase has
    no parameter of one of the names."""
    params = renamed(params)
    if any(k not in ph.params for k in params):
        return None
    return {k: v for k, v in params.items() if v != ph.params[k]}


def as_ran(ph, problem, requested: dict, recorded: dict) -> dict:
    """The configuration a row measured, in today's terms: ``requested`` where a recorded value says it ran
    otherwise (a value the phase resolved then, not its declared default, that today's resolution of the same
    request for the same problem no longer gives: the row measured a former default, e.g. two consumer
    warpgroups with 64-key tiles before warp_specialized_tc's D=64 default became three with 128), and without
    the requested values today's defaults give anyway (``Bc=128`` where the automatic Bc resolves to 128), so a
    row of a former default never stands for today's and two spellings of one configuration count as one."""
    try:
        today = ph.resolve(problem, ph.resolve_params(requested))
        default = ph.resolve(problem, ph.resolve_params({}))
    except (TypeError, ValueError):  # (AttentionInputError is a ValueError)
        return requested
    cfg = dict(requested)
    for k, v in (recorded or {}).items():
        if k in ph.params and v is not None and v != ph.params[k] and k in today and today[k] != v:
            cfg[k] = v
    return {k: v for k, v in cfg.items() if default.get(k, ph.params.get(k)) != v}


def measurements(files=None, cache: str | None = None, skipped: dict | None = None) -> list[dict]:
    """One record per timed measurement: ``key, phase, requested, params, time_ms, label, file,
    commit, run_id``. ``skipped`` (a dict) counts what was left out, by reason."""
    from numba_attn.phases.registry import get_phase

    skipped = {} if skipped is None else skipped

    def skip(why):
        skipped[why] = skipped.get(why, 0) + 1

    def phase(name):
        try:
            return get_phase(name)
        except KeyError:
            return None

    out, seen = [], set()
    for file, env, r in measured_rows(files, strict=True):
        ph = phase(r.get("phase"))
        if ph is None:
            skip(f"phase {r.get('phase')!r} is not registered")
            continue
        layout = getattr(ph, "layout", "contiguous") or "contiguous"
        shape = r.get("problem") or {}
        if layout != "contiguous" or shape.get("page_size") or shape.get("varlen"):
            skip(f"a {layout if layout != 'contiguous' else 'paged or varlen'} layout: attention() reads contiguous "
                 f"arrays (decode_paged and attention_varlen choose their own phases)")
            continue
        if shape.get("input_dtype"):
            skip(f"{shape['input_dtype']} inputs: attention() reads float inputs (attention_fp8 names its phase)")
            continue
        requested = _config(ph, r.get("requested_params"))
        if requested is None or any(k not in ph.params for k in renamed(r.get("params"))):
            skip(f"{ph.name}: a parameter the phase no longer has")
            continue
        try:
            prob = _problem(r["problem"])
        except (TypeError, ValueError):
            skip("a problem that does not validate")
            continue
        requested = as_ran(ph, prob, requested, renamed(r.get("params")))
        m = {"key": cache_key(r["gpu"], prob), "phase": ph.name, "requested": requested,
             "params": renamed(r.get("params")), "time_ms": float(r["time_ms"]), "label": prob.label,
             "file": file, "commit": commit_of(r, env), "run_id": r.get("run_id")}
        seen.add((m["key"], m["phase"], _canon(requested), m["label"], m["time_ms"]))
        out.append(m)
    if cache:
        entries = TuningCache(cache).load()["entries"]
        for key in sorted(entries):
            for name, e in sorted(entries[key].get("phases", {}).items()):
                t = e.get("time_ms")
                if not isinstance(t, (int, float)) or isinstance(t, bool) or not t > 0:
                    continue  # simulator entries are untimed
                ph = phase(name)
                requested = _config(ph, e.get("params")) if ph is not None else None
                if requested is None:
                    skip(f"tuning cache: {name} is not registered or has other parameters")
                    continue
                ident = (key, name, _canon(requested), e.get("label"), float(t))
                if ident in seen:  # the same row, read from its results file
                    continue
                seen.add(ident)
                out.append({"key": key, "phase": name, "requested": requested,
                            "params": renamed(e.get("resolved")), "time_ms": float(t),
                            "label": e.get("label") or "?", "file": _shown_file(e.get("results")) + " (tuning cache)",
                            "commit": str(e.get("commit") or "not recorded"), "run_id": e.get("run_id")})
    return out


# -- ranking -------------------------------------------------------------------------------------

def _geomean(xs) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def rank(ms: list[dict]) -> list[dict]:
    """The configurations of one key's measurements, best first (see the module docstring)."""
    cells: dict = {}  # label → config → [measurements]
    for m in ms:
        cells.setdefault(m["label"], {}).setdefault((m["phase"], _canon(m["requested"])), []).append(m)
    med: dict = {}  # label → config → the median measurement
    for label, by_cfg in cells.items():
        for cfg, rows in by_cfg.items():
            rows = sorted(rows, key=lambda m: (m["time_ms"], m["file"], m["run_id"] or ""))
            med.setdefault(label, {})[cfg] = rows[(len(rows) - 1) // 2]
    contested = {label: min(m["time_ms"] for m in by.values()) for label, by in med.items() if len(by) > 1}
    ref = max(med, key=lambda lb: (len(med[lb]), sum(len(v) for v in cells[lb].values()), lb))
    configs = sorted({cfg for by in med.values() for cfg in by})
    wins = {cfg: 0 for cfg in configs}
    losses = {cfg: 0 for cfg in configs}
    for i, a in enumerate(configs):
        for b in configs[i + 1:]:
            shared = [lb for lb in sorted(contested) if a in med[lb] and b in med[lb]]
            if not shared:
                continue
            r = _geomean([med[lb][a]["time_ms"] / med[lb][b]["time_ms"] for lb in shared])
            if r < 1:
                wins[a], losses[b] = wins[a] + 1, losses[b] + 1
            elif r > 1:
                wins[b], losses[a] = wins[b] + 1, losses[a] + 1
    ranked = []
    for cfg in configs:
        ratios = [med[lb][cfg]["time_ms"] / t for lb, t in sorted(contested.items()) if cfg in med[lb]]
        own = ref if cfg in med[ref] else max((lb for lb in med if cfg in med[lb]), key=lambda lb: (len(med[lb]), lb))
        m = med[own][cfg]
        score = _geomean(ratios) if ratios else None
        item = {"phase": cfg[0], "requested": m["requested"], "params": m["params"], "time_ms": m["time_ms"],
                "wins": wins[cfg], "losses": losses[cfg], "score": round(score, 4) if score is not None else None,
                "shared_problems": len(ratios), "rows": sum(len(cells[lb][cfg]) for lb in cells if cfg in cells[lb]),
                "source": {"file": m["file"], "label": m["label"], "commit": m["commit"], "run_id": m["run_id"]}}
        order = ((0, losses[cfg] - wins[cfg], score, -len(ratios), m["time_ms"]) if ratios
                 else (1, 0, 0.0, 0, m["time_ms"]))
        ranked.append((order, cfg, item))
    ranked.sort(key=lambda x: (x[0], x[1]))
    return [item for _, _, item in ranked]


def gpu_models(files=None) -> dict:
    """``{GPU model: {"compute_capability": "9.0", "sm_count": 132}}`` of the runs whose timed rows ``files`` hold
    (from their env records; a value no run recorded is None): how a GPU with no entry of its own finds the
    entries of another model of its compute capability (:func:`choose_other`)."""
    out: dict = {}
    for _file, env, r in measured_rows(files):
        info = out.setdefault(r["gpu"], {"compute_capability": None, "sm_count": None})
        for k in info:
            if info[k] is None and (env or {}).get(k) is not None:
                info[k] = str(env[k]) if k == "compute_capability" else env[k]
    return {g: out[g] for g in sorted(out)}


def build(files=None, cache: str | None = None, *, never_default, skipped: dict | None = None) -> dict:
    """The dispatch table from ``files`` (default: the committed results files) and the tuning
    ``cache`` (none by default). ``never_default``: phases ``phase=None`` never runs."""
    from numba_attn.phases.registry import get_phase

    files = results_files() if files is None else list(files)
    ms = measurements(files, cache, skipped)
    by_key: dict = {}
    for m in ms:
        by_key.setdefault(m["key"], []).append(m)
    entries = {}
    for key in sorted(by_key):
        ranking = rank(by_key[key])
        chosen = None
        for i, item in enumerate(ranking):
            ph = get_phase(item["phase"])
            if ph.name in never_default:
                item["excluded"] = "never a default (run it by name)"
            elif ph.precision is not None:
                item["excluded"] = f"computes in {ph.precision}, below the input precision (allow_tf32=True)"
            elif not ph.is_builtin:
                item["excluded"] = "not a phase of the package"
            elif chosen is None:
                chosen = i
        entry = {"ranking": ranking, "rank": chosen}
        if chosen is not None:
            top = ranking[chosen]
            entry.update({k: top[k] for k in ("phase", "requested", "params", "time_ms", "source")})
        else:
            entry["phase"] = None
        entries[key] = entry
    return {"version": VERSION, "command": BUILD_COMMAND + (f" --cache {cache}" if cache else ""),
            "rule": RULE, "sources": [_shown_file(f) for f in files] + ([_shown_file(cache)] if cache else []),
            "gpus": gpu_models(files), "entries": entries}


def dumps(table: dict) -> str:
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def write(table: dict, path: str | None = None) -> str:
    path = path or PACKAGE_TABLE
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(dumps(table))
    os.replace(tmp, path)
    return path


def expand(patterns) -> list[str]:
    """``--results`` arguments: paths, or glob patterns the shell did not expand."""
    out = []
    for p in patterns:
        hits = sorted(glob.glob(p)) if any(c in p for c in "*?[") else [p]
        if not hits:
            raise OSError(f"{p}: no results file matches")
        out.extend(hits)
    return out


# -- reading the table ---------------------------------------------------------------------------

_LOADED: dict = {}  # path → ((mtime_ns, size, inode), table)


def load(path: str | None = None) -> dict:
    """The table at ``path`` (default :func:`table_path`), read once per modification; an empty
    table when the file does not exist; ValueError when it is not a dispatch table."""
    path = path or table_path()
    try:
        st = os.stat(path)
    except OSError:
        return {"version": VERSION, "entries": {}}
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    hit = _LOADED.get(path)
    if hit and hit[0] == stamp:
        return hit[1]
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a dispatch table ({exc})") from None
    if not isinstance(table, dict) or not isinstance(table.get("entries"), dict):
        raise ValueError(f"{path}: not a dispatch table (no 'entries' object)")
    _LOADED[path] = (stamp, table)
    return table


def lookup(gpu: str, problem, path: str | None = None) -> dict | None:
    """The entry of ``problem``'s key on ``gpu``, or None."""
    entry = load(path)["entries"].get(cache_key(gpu, problem))
    return entry if isinstance(entry, dict) else None


def source_text(item: dict) -> str:
    s = item.get("source") or {}
    return f"{s.get('file', '?')} {s.get('label', '?')} @{s.get('commit', '?')}"


def _cfg_text(item: dict) -> str:
    req = item.get("requested") or {}
    return f"{item['phase']} {json.dumps(req, sort_keys=True)}" if req else item["phase"]


def measured_default(entry: dict | None, phase: str) -> bool:
    """Whether ``entry``'s ranking holds ``phase`` with today's default parameters (``requested`` empty: see
    :func:`as_ran`), i.e. whether the entry's choice was measured against that configuration."""
    return any(isinstance(it, dict) and it.get("phase") == phase and not it.get("requested")
               for it in (entry or {}).get("ranking") or ())


def choose(problem, candidates, gpu: str, path: str | None = None, needs: str | None = None):
    """``(phase, params, why)`` from the table for ``problem`` on ``gpu``: the first configuration
    of the key's ranking whose phase is among ``candidates`` and supports the problem with its
    parameters; None when the table has no entry or none of its configurations runs here (a
    table that cannot be read counts as none). ``needs`` (a phase name): the entry counts only when it
    measured that phase with its default parameters (:func:`measured_default`; the rule's phase, which an
    entry that never measured it cannot overrule), and a configuration ranked above it only when its row is of
    the same problem as the rule's phase's (a key holds several problems: one never timed beside the rule's
    phase cannot overrule it either)."""
    path = path or table_path()
    try:
        entry = lookup(gpu, problem, path)
    except ValueError:
        return None
    if entry is None or (needs is not None and not measured_default(entry, needs)):
        return None
    names = {p.name: p for p in candidates}
    ranking = [it for it in entry.get("ranking") or () if isinstance(it, dict) and isinstance(it.get("phase"), str)]
    skipped = []
    beside = {(it.get("source") or {}).get("label") for it in ranking
              if it["phase"] == needs and not it.get("requested")}  # (needs) the problems the rule's phase ran
    for item in ranking:
        if needs is not None and item["phase"] != needs and (item.get("source") or {}).get("label") not in beside:
            skipped.append(f"{_cfg_text(item)}: not timed beside {needs} (another problem of the key)")
            continue
        ph = names.get(item["phase"])
        if ph is None:
            skipped.append(f"{_cfg_text(item)}: {item.get('excluded') or 'not a candidate here'}")
            continue
        params = dict(item.get("requested") or {})
        reason = ph.supports(problem, **params)
        if reason:
            skipped.append(f"{_cfg_text(item)}: {reason}")
            continue
        rank_text = (f"the fastest of {len(ranking)} measured configurations" if not skipped else
                     f"the fastest of {len(ranking)} measured configurations that runs here (faster, skipped: "
                     f"{'; '.join(skipped[:3])}{'; …' if len(skipped) > 3 else ''})")
        t = item.get("time_ms")
        why = (f"dispatch table ({shown_path(path)}: {_cfg_text(item)}"
               f"{f' {t:.4g} ms' if isinstance(t, (int, float)) else ''} on {gpu}, {rank_text}; "
               f"row {source_text(item)})")
        return ph, params, why
    return None


def other_models(gpu: str, cc, path: str | None = None) -> list[str]:
    """The GPU models of the table other than ``gpu`` whose runs recorded the compute capability ``cc``
    (``(9, 0)`` or ``"9.0"``), by name."""
    want = ".".join(map(str, cc)) if isinstance(cc, (tuple, list)) else str(cc)
    try:
        models = load(path).get("gpus") or {}
    except ValueError:
        return []
    return sorted(g for g, info in models.items()
                  if g != gpu and isinstance(info, dict) and str(info.get("compute_capability")) == want)


def choose_other(problem, candidates, gpu: str, cc, path: str | None = None, needs: str | None = None):
    """``(phase, params, why)`` from the entry of ``problem``'s key measured on another GPU model of compute
    capability ``cc`` (:func:`other_models`), for a GPU model with no entry of its own that counts: of the
    models whose entry counts (``needs``, as :func:`choose`), the one whose entry compared the most
    configurations, then by name; None when there is none."""
    path = path or table_path()
    found = []
    for other in other_models(gpu, cc, path):
        try:
            entry = lookup(other, problem, path)
        except ValueError:
            return None
        hit = choose(problem, candidates, other, path, needs) if entry is not None else None
        if hit:
            found.append((-len(entry.get("ranking") or ()), other, hit))
    if not found:
        return None
    _, other, (ph, params, why) = min(found, key=lambda x: x[:2])
    return ph, params, f"{why}; no entry measured on {gpu} counts: the entry of {other}, of the same compute capability"


# -- showing it ------------------------------------------------------------------------------------

def _ms(t) -> str:
    return f"{t:.4g} ms" if isinstance(t, (int, float)) else "—"


def _sort_key(key: str):
    parts = key.split("|")
    if len(parts) != 7:
        return (key,)
    gpu, dtype, mask, d, g, mode, kv = parts
    num = [int(x[n:]) if x[n:].isdigit() else 0 for x, n in ((d, 1), (g, 1), (kv, 2))]
    return (gpu, dtype, mask, num[0], num[1], mode, num[2])


def show(table: dict, console=None, path: str | None = None) -> None:
    """The table through ``rich``, one per GPU model: per key the chosen configuration, its time,
    problem and source row, and the runners-up with their times (``x``: excluded, never chosen
    by default)."""
    from rich.table import Table

    from numba_attn.report.table import make_console

    console = console or make_console()
    entries = table.get("entries", {})
    console.print(f"dispatch table{' ' + shown_path(path) if path else ''}: {len(entries)} key(s)",
                  markup=False, highlight=False)
    if table.get("command"):
        console.print(f"built by `{table['command']}` from {', '.join(table.get('sources', [])) or 'nothing'}",
                      markup=False, highlight=False, soft_wrap=True)
    by_gpu: dict = {}
    for key in sorted(entries, key=_sort_key):
        by_gpu.setdefault(key.split("|")[0], []).append(key)
    for gpu, keys in by_gpu.items():
        tab = Table(box=None, header_style="bold", pad_edge=False, title=gpu, title_justify="left",
                    title_style="bold")
        for name, right in (("key", False), ("phase", False), ("time", True), ("measured at", False),
                            ("runners-up", False), ("source row", False)):
            tab.add_column(name, justify="right" if right else "left", no_wrap=name != "runners-up")
        for key in keys:
            e = entries[key]
            ranking = [it for it in e.get("ranking") or () if isinstance(it, dict)]
            r = e.get("rank")
            top = ranking[r] if isinstance(r, int) and 0 <= r < len(ranking) else None
            others = [f"{_cfg_text(it)} {_ms(it.get('time_ms'))}{' x' if it.get('excluded') else ''}"
                      for it in ranking if it is not top]
            src = (top or {}).get("source") or {}
            cells = [" ".join(key.split("|")[1:]),
                     _cfg_text(top) if top else "— (every one excluded)", _ms(top.get("time_ms")) if top else "—",
                     src.get("label", ""), "; ".join(others[:2]) + (f"; +{len(others) - 2}" if len(others) > 2 else ""),
                     f"{src.get('file', '')} @{src.get('commit', '')}" if top else ""]
            tab.add_row(*[c.replace("[", "\\[") for c in cells])
        console.print()
        console.print(tab)
    console.print("\nx: measured but never chosen by default (never a default, or below the input precision); "
                  "`numba-attn dispatch --show` prints this table, numba_attn.explain(q, k, v) says what a call runs",
                  markup=False, highlight=False, soft_wrap=True)


def stale(path: str | None = None, files=None, *, never_default) -> bool:
    """True when the table at ``path`` (default: the package's) differs from a build from the
    committed results files."""
    path = path or PACKAGE_TABLE
    try:
        with open(path, encoding="utf-8") as f:
            current = json.load(f)
    except (OSError, ValueError):
        return True
    return current != json.loads(dumps(build(files, None, never_default=never_default)))
