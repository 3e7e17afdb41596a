"""Reading ``charge``'s side-effect ledger (``tests/faults/fault_tools.py``) and judging a call by it (issue 28).

Every ``charge`` call of a run has an argument of its own, and the key the client sent is bound to that argument,
so the ledger's lines for an argument are the runs of one call under one key. :func:`judge` holds a call's
outcome to acceptance 1: at most one run, under the key the client sent; a result, exactly one run that ended;
"may have run" only where a SIGKILL landed during the call's own run, said as which (:data:`CRASH_KINDS`);
anything else is a finding (a :class:`Verdict` not ``ok``) for the harness to raise.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

CRASH_IN_TOOL = "killed during the tool"
"""A ``start`` with no ``end`` or ``abort`` in the file of a process SIGKILLed: the tool was running."""
CRASH_AFTER_TOOL = "killed after the tool, before its answer was stored"
"""A ``start`` and an ``end`` in a killed process's file: the tool returned, its answer was not yet committed."""
CRASH_BEFORE_TOOL = "killed after the key was recorded, before the tool started"
"""No run at all, the server killed in the schedule: the key was committed (else the re-issue would have run it)
and the process died before the tool's first line."""
CRASH_KINDS = (CRASH_IN_TOOL, CRASH_AFTER_TOOL, CRASH_BEFORE_TOOL)


@dataclass
class Run:
    pid: int
    key: str
    ended: str | None = None
    """``end`` or ``abort`` when the process noted one."""


class Ledger:
    """The ledger files of one directory, read as they grow (each refresh reads only the new lines)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.runs: dict[str, list[Run]] = {}
        """By the call's argument (``amount``), in the order noted within each process."""
        self._read: dict[Path, int] = {}
        self._open: dict[tuple[int, str], Run] = {}

    def refresh(self) -> Ledger:
        for path in sorted(self.directory.glob("charge-*.log")):
            pid = int(path.stem.removeprefix("charge-"))
            with path.open("rb") as file:
                file.seek(self._read.get(path, 0))
                text = file.read()
            whole = text[: text.rfind(b"\n") + 1]  # a line is one write: whole once there, but read to its end
            self._read[path] = self._read.get(path, 0) + len(whole)
            for line in whole.decode().splitlines():
                what, key, amount = line.split(" ", 2)
                if what == "start":
                    run = Run(pid, key)
                    self.runs.setdefault(amount, []).append(run)
                    self._open[pid, amount] = run
                elif (pid, amount) in self._open:
                    self._open.pop((pid, amount)).ended = what
        return self

    def repeated(self) -> dict[str, list[Run]]:
        """Every argument run more than once, over everything noted so far."""
        return {amount: runs for amount, runs in self.runs.items() if len(runs) > 1}


@dataclass(frozen=True)
class Verdict:
    kind: str
    """``ran once``, one of :data:`CRASH_KINDS`, or what went wrong (``ok`` false), fit to be counted."""
    ok: bool = True
    detail: str = ""


def judge(argument: str, result: bool, ledger: Ledger, killed: Collection[int]) -> Verdict:
    """What the ledger says of a call that ended with its result (``result``) or "may have run". ``killed``: the
    pids SIGKILLed in its schedule."""
    runs = ledger.runs.get(argument, [])
    seen = f"runs {[(r.pid, r.key, r.ended or 'unfinished') for r in runs]}, killed {list(killed)}"
    if len(runs) > 1:
        return Verdict("ran more than once", False, seen)
    if any(run.key == "-" for run in runs):
        return Verdict("ran without an idempotency key", False, seen)
    if result:
        if len(runs) != 1 or runs[0].ended != "end":
            return Verdict("a result without one finished run", False, seen)
        return Verdict("ran once")
    if not runs:
        return Verdict(CRASH_BEFORE_TOOL) if killed else Verdict("may have run, not run, no kill", False, seen)
    run = runs[0]
    if run.pid not in killed:
        return Verdict("may have run, its server not killed", False, seen)
    if run.ended is None:
        return Verdict(CRASH_IN_TOOL)
    if run.ended == "end":
        return Verdict(CRASH_AFTER_TOOL)
    return Verdict("may have run, its run aborted before the kill", False, seen)
