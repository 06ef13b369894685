"""The progress of a sweep on the terminal: one line per finished row (status, time or reason, ETA, the best
so far), a heartbeat for a long row and, on a terminal, a live bar (through ``rich``). :class:`TuneProgress`
names each row of a tuning by its parameters."""
from __future__ import annotations

import sys
import time

class Progress:
    """One line per finished row (status, time or reason, ETA, the best phase so far); on a terminal
    also a live bar with the row in progress, elapsed time and ETA (through ``rich``)."""

    def __init__(self, stream=None, console=None):
        from numba_attn.report.table import make_console

        self.console = console or make_console(stream or sys.stderr)
        self.t0 = time.perf_counter()
        self.row_t0 = self.t0
        self.counts: dict = {}
        self.best: dict = {}  # problem label → (time_ms, phase)
        self.bar = None
        self.task = None
        self.beat = None  # the running row's heartbeat (a threading.Event that stops it)

    BEAT_FIRST_S, BEAT_EVERY_S = 5.0, 30.0  # a row running longer says so, then again every 30 s

    def _start_beat(self, i, n, name, problem):
        """A row that runs more than BEAT_FIRST_S seconds gets a line ``row i/n NAME PROBLEM: running for
        Ns`` (on a terminal: the live bar's description shows the row's elapsed time instead)."""
        import threading

        self._stop_beat()
        stop = self.beat = threading.Event()
        t0, w = self.row_t0, len(str(n))

        def loop():
            wait = self.BEAT_FIRST_S
            while not stop.wait(wait):
                el = time.perf_counter() - t0
                if self.bar is not None:
                    self.bar.update(self.task, description=f"{name} {problem.label} ({el:.0f}s)")
                    wait = 1.0
                else:
                    self.console.print(f"[{'row':>{w}} {i + 1:>{w}}/{n}] {name} {problem.label}: running for {el:.0f}s",
                                       markup=False, highlight=False, soft_wrap=True)
                    wait = self.BEAT_EVERY_S

        threading.Thread(target=loop, daemon=True, name="numba-attn-row-progress").start()

    def _stop_beat(self):
        if self.beat is not None:
            self.beat.set()
            self.beat = None

    def _start_bar(self, n):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self.bar = Bar(TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                       TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=self.console,
                       transient=True)
        self.task = self.bar.add_task("", total=n)
        self.bar.start()

    def close(self):
        self._stop_beat()
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def eta(self, done, n) -> str:
        el = time.perf_counter() - self.t0
        if done <= 0 or done >= n:
            return ""
        left = el / done * (n - done)
        return f"ETA {int(left // 60)}:{int(left % 60):02d}"

    def best_text(self, label) -> str:
        if label in self.best:
            ms, name = self.best[label]
            return f"best {name} {ms:.4g} ms"
        return " ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))

    def __call__(self, i, n, row, name, problem):
        el = time.perf_counter() - self.t0
        if problem is None:  # the ceilings
            self.console.print(f"[{el:6.1f}s] ceilings measured in {row.get('wall_s', 0):.1f}s", markup=False)
            return
        if row is None:
            self.row_t0 = time.perf_counter()
            if self.bar is None and self.console.is_terminal:
                self._start_bar(n)
            if self.bar is not None:
                self.bar.update(self.task, description=f"{name} {problem.label}")
            self._start_beat(i, n, name, problem)
            return
        self._stop_beat()
        st = row.get("status", "?")
        self.counts[st] = self.counts.get(st, 0) + 1
        extra = ""
        if row.get("time_ms"):
            extra = f"{row['time_ms']:.4f} ms"
            if st == "OK" and (problem.label not in self.best or row["time_ms"] < self.best[problem.label][0]):
                self.best[problem.label] = (row["time_ms"], name)
        elif row.get("reason") and st != "OK":
            extra = f"({row['reason'] if row.get('sim_estimate_s') else row['reason'][:100]})"  # (the shape that fits)
        if row.get("resumed"):
            extra += " (resumed)"
        w = len(str(n))
        note = " · ".join(x for x in (self.eta(i + 1, n), self.best_text(problem.label)) if x)
        style = {"OK": "green", "SKIP": "yellow"}.get(st, "bold red")
        from rich.markup import escape

        self.console.print(f"[{i + 1:>{w}}/{n} {el:6.1f}s] {escape(name):22s} {escape(problem.label):28s} "
                           f"[{style}]{st:7s}[/] {escape(extra)} [dim]({time.perf_counter() - self.row_t0:.1f}s"
                           f"{' · ' + note if note else ''})[/]", soft_wrap=True, highlight=False)
        if self.bar is not None:
            self.bar.update(self.task, completed=i + 1)


class TuneProgress(Progress):
    """Progress of a tuning: each row named by its phase and requested parameters; the best so far
    (least time; untimed in the simulator: the first OK configuration, the default when it is OK)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.best_cfg: dict = {}  # problem label → (time_ms or None, text)

    def best_text(self, label) -> str:
        if label in self.best_cfg:
            ms, text = self.best_cfg[label]
            return f"best {text}" + (f" {ms:.4g} ms" if ms else "")
        return super().best_text(label)

    def __call__(self, i, n, row, name, problem):
        if row is not None and problem is not None:
            req = row.get("requested_params") or {}
            text = f"{name} {req}" if req else f"{name} (default)"
            if row.get("status") == "OK":
                ms = row.get("time_ms")
                cur = self.best_cfg.get(problem.label)
                if cur is None or (ms and (cur[0] is None or ms < cur[0])) or (not req and not ms):
                    self.best_cfg[problem.label] = (ms, text)
            name = text
        return super().__call__(i, n, row, name, problem)
