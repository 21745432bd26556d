"""The sandbox: coded actions are compiled by RestrictedPython and run in a worker process.

Two walls stand between a coded action and the learner:

- **The language** (`compile_action`): RestrictedPython's `compile_restricted` with a policy
  that also refuses `import`, class definitions and the builtins that reach outside (`open`,
  `globals`, ...); names and attributes starting with `_` are refused (no `__class__` /
  `__subclasses__` escapes), `eval` / `exec` too. Attribute and item access go through
  RestrictedPython's guards (`safer_getattr`, `full_write_guard`: only lists and dicts can be
  written to). `validate(source)` reports these problems without running anything.
- **The process** (`Sandbox`): calls run in a spawned worker with its address space (memory) and
  CPU time limited by `resource`, a budget of executed lines per call (counted with
  `sys.settrace` in the coded action's own frames: a long loop fails fast with a clear message),
  and a wall-clock timeout per call enforced by the parent: a call that overruns (a loop with
  the budget off, or a long computation in C that runs no line) gets the worker killed; the next
  call starts a new one.

Each call runs the source afresh (its module body, then `step(view, memory)`): nothing but
`memory` survives from one call to the next, and `memory` travels with the call (it must hold
plain data). Every failure comes back as data, a `CallResult` whose `error_kind` is one of
`ERROR_KINDS` and whose `error` is one line a person (or the slow LLM agent) can act on; the
caller never sees an exception from the coded action.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import math
import multiprocessing
import operator
import os
import pickle
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import CodeType, MappingProxyType
from typing import Any

from RestrictedPython import RestrictingNodeTransformer, compile_restricted_exec, safe_builtins
from RestrictedPython.Eval import default_guarded_getitem, default_guarded_getiter
from RestrictedPython.Guards import (
    full_write_guard,
    guarded_iter_unpack_sequence,
    guarded_unpack_sequence,
    safer_getattr,
)
from RestrictedPython.PrintCollector import PrintCollector

__all__ = [
    "DONE",
    "ERROR_KINDS",
    "CallResult",
    "Sandbox",
    "SandboxConfig",
    "compile_action",
    "validate",
]

DONE = "done"
"""What `step` returns when the coded action has finished."""
ERROR_KINDS: tuple[str, ...] = ("compile", "runtime", "timeout", "budget", "invalid_action")
FILENAME = "<coded action>"
"""The file name of coded actions' code objects: the line budget counts lines of these only."""

# Builtins that reach outside the sandbox, named at compile time rather than failing later as
# an undefined name. (`eval` / `exec` are refused by RestrictedPython itself.)
_REFUSED_NAMES = frozenset(
    {"open", "globals", "locals", "vars", "dir", "compile", "input", "breakpoint", "exit", "quit"}
    | {"help", "memoryview", "getattr", "hasattr", "setattr", "delattr", "__import__"}
)
# Builtins beyond RestrictedPython's `safe_builtins`. RestrictedPython leaves out those that
# iterate in C because they bypass the `_getiter_` guard; that guard protects access-controlled
# containers, and a coded action only ever sees plain tuples, so they are safe here. A loop in
# C runs no line of the budget: the wall-clock timeout ends it.
_EXTRA_BUILTINS = {
    name: getattr(builtins, name)
    for name in (
        "all",
        "any",
        "dict",
        "enumerate",
        "filter",
        "frozenset",
        "list",
        "map",
        "max",
        "min",
        "reversed",
        "set",
        "sorted",
        "sum",
        "tuple",
        "zip",
    )  # fmt: skip
}
_PLAIN_SCALARS = (type(None), bool, int, float, str)
_INPLACE = {
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow,
    "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor,
    "<<=": operator.ilshift, ">>=": operator.irshift,
}  # fmt: skip


@dataclass(frozen=True)
class SandboxConfig:
    """The limits of one call of a coded action."""

    line_budget: int | None = 10_000
    """Lines of the coded action a call may execute (module body and `step`); None: no budget
    (the wall-clock timeout still holds)."""
    timeout_s: float = 1.0
    """Wall-clock seconds a call may take, measured by the parent; past it the worker is
    killed and restarted."""
    cpu_s: int = 5
    """CPU seconds a call may use (`RLIMIT_CPU`, whole seconds); a backstop behind the timeout
    should the parent be slow to act."""
    memory_mb: int = 512
    """Address space the worker may add to what it had at start (`RLIMIT_AS`)."""
    start_timeout_s: float = 60.0
    """Seconds to wait for a new worker to be ready (an interpreter starting on a busy host)."""

    def __post_init__(self) -> None:
        if self.line_budget is not None and self.line_budget < 1:
            raise ValueError(f"line_budget must be positive or None, got {self.line_budget}")
        if self.timeout_s <= 0 or self.start_timeout_s <= 0:
            raise ValueError("timeout_s and start_timeout_s must be positive")
        if self.cpu_s < 1 or self.memory_mb < 1:
            raise ValueError(
                f"cpu_s and memory_mb must be >= 1, got {self.cpu_s}, {self.memory_mb}"
            )


@dataclass(frozen=True)
class CallResult:
    """What one call of `step(view, memory)` gave."""

    ok: bool
    action: str | None = None
    """The word `step` returned (an action word or `DONE`) when `ok`."""
    error_kind: str | None = None
    """One of `ERROR_KINDS` when not `ok`."""
    error: str | None = None
    """One line saying what went wrong, when not `ok`."""
    memory: dict[str, Any] = field(default_factory=dict)
    """`memory` after the call (as far as the call got; as passed in after a timeout)."""
    lines: int = 0
    """Lines of the coded action the call executed."""
    seconds: float = 0.0
    """Wall-clock seconds of the call, as the parent saw them (round trip included)."""


class _Policy(RestrictingNodeTransformer):
    """RestrictedPython's policy, plus what a coded action never needs."""

    def visit_Import(self, node: ast.Import) -> ast.AST:
        self.error(node, "import is not allowed")
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        self.error(node, "import is not allowed")
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        self.error(node, "class definitions are not allowed: use functions, dicts and tuples")
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in _REFUSED_NAMES:
            self.error(node, f"{node.id} is not allowed in a coded action")
            return node
        return super().visit_Name(node)


def compile_action(source: str) -> tuple[CodeType | None, str | None]:
    """Compile a coded action: (code, None), or (None, the first problem in one line)."""
    if not isinstance(source, str):
        return None, f"the source must be a string, got {type(source).__name__}"
    result = compile_restricted_exec(source, FILENAME, policy=_Policy)
    if result.errors:
        return None, _first_line(result.errors[0])
    tree = ast.parse(source)
    steps = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "step"
    ]
    if not steps:
        return None, "no function step(view, memory) is defined at the top level"
    arguments = steps[-1].args
    if len(arguments.posonlyargs) + len(arguments.args) != 2 or arguments.vararg:
        return None, "step must take exactly two arguments: step(view, memory)"
    return result.code, None


def validate(source: str) -> str | None:
    """The compile-time problem of a coded action (syntax, a refused construct, no `step`) in
    one line, or None if it compiles; nothing is run."""
    return compile_action(source)[1]


class Sandbox:
    """The parent's end of the worker that runs coded actions (see the module docstring).

    >>> with Sandbox(["turn left", "go forward"]) as sandbox:  # doctest: +SKIP
    ...     result = sandbox.call("def step(view, memory):\\n    return 'go forward'\\n", {}, {})
    >>> result.ok, result.action  # doctest: +SKIP
    (True, 'go forward')
    """

    def __init__(self, action_words: Sequence[str], cfg: SandboxConfig | None = None) -> None:
        """
        Args:
            action_words: the primitive words `step` may return (besides `DONE`).
            cfg: the limits; the defaults if None.
        """
        self.action_words: tuple[str, ...] = tuple(action_words)
        if DONE in self.action_words:
            raise ValueError(f"{DONE!r} is reserved for a coded action that has finished")
        self.cfg = cfg or SandboxConfig()
        self.restarts = 0
        """Workers started after the first (each one after a timeout or a crash)."""
        self._allowed = frozenset(self.action_words) | {DONE}
        self._process: Any = None
        self._conn: Any = None
        self._closed = False
        self._start()

    @property
    def pid(self) -> int | None:
        """The worker's process id (None between a kill and the next call)."""
        return None if self._process is None else self._process.pid

    def validate(self, source: str) -> str | None:
        """See `validate`."""
        return validate(source)

    def call(self, source: str, view: Mapping[str, Any], memory: dict[str, Any]) -> CallResult:
        """Run `source`'s `step(view, memory)` once; never raises for the coded action's sake.

        Args:
            source: the coded action's source.
            view: plain data (`glam.codeact.api.build_view`); the coded action sees it read-only.
            memory: the execution's memory (plain data); the result carries it after the call.
        """
        if self._closed:
            raise RuntimeError("the sandbox is closed")
        if self._process is None:
            self._start()
            self.restarts += 1
        start = time.perf_counter()
        try:
            self._conn.send((source, dict(view), memory))
            answered = self._conn.poll(self.cfg.timeout_s)
            reply = self._conn.recv() if answered else None
        except (EOFError, OSError):
            return self._died(memory, time.perf_counter() - start)
        seconds = time.perf_counter() - start
        if reply is None:
            self._kill()
            message = f"took longer than {self.cfg.timeout_s:g} s"
            return CallResult(False, None, "timeout", message, memory, 0, seconds)
        kind, value, memory_after, lines = reply
        if kind is not None:
            return CallResult(False, None, kind, value, memory_after, lines, seconds)
        if value not in self._allowed:
            words = ", ".join(repr(word) for word in self.action_words)
            message = f"step returned {value!r}, which is not one of {words} or {DONE!r}"
            return CallResult(False, None, "invalid_action", message, memory_after, lines, seconds)
        return CallResult(True, value, None, None, memory_after, lines, seconds)

    def close(self) -> None:
        """Stop the worker (asked first, then killed); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._process is not None and self._process.is_alive():
            with contextlib.suppress(OSError, ValueError):
                self._conn.send(None)
            self._process.join(timeout=2.0)
        self._kill()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, worker_end = context.Pipe()
        self._process = context.Process(
            target=serve,
            args=(worker_end, self.cfg, os.getpid()),
            name="glam-codeact-sandbox",
            daemon=True,
        )
        self._process.start()
        worker_end.close()
        try:
            ready = self._conn.poll(self.cfg.start_timeout_s) and self._conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self._kill()
            raise RuntimeError(
                f"the coded-action sandbox's worker did not start in "
                f"{self.cfg.start_timeout_s:g} s (or died starting)"
            )

    def _kill(self) -> None:
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join()
            self._process.close()
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    def _died(self, memory: dict[str, Any], seconds: float) -> CallResult:
        """The worker died during a call (a resource limit, a crash): report, restart later."""
        self._process.join(timeout=5.0)
        code = self._process.exitcode
        self._kill()
        if code == -signal.SIGXCPU:
            kind, message = "timeout", f"used more than {self.cfg.cpu_s} s of CPU time"
        else:
            kind, message = "runtime", f"the sandbox process died (exit code {code})"
        return CallResult(False, None, kind, message, memory, 0, seconds)


# ---- the worker ----


def serve(conn: Any, cfg: SandboxConfig, parent_pid: int) -> None:
    """The worker's loop: answer calls until told to stop (None) or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _limit_memory(cfg.memory_mb)
    compiled: dict[str, tuple[CodeType | None, str | None]] = {}
    conn.send("ready")
    while True:
        if not conn.poll(1.0):
            if os.getppid() != parent_pid:  # the parent died: do not linger
                return
            continue
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        source, view, memory = request
        if source not in compiled:
            if len(compiled) >= 256:  # a critic loop rewrites actions: keep the cache bounded
                compiled.clear()
            compiled[source] = compile_action(source)
        del request
        conn.send_bytes(_reply_bytes(compiled[source], view, memory, cfg))


def _reply_bytes(
    compiled: tuple[CodeType | None, str | None],
    view: dict[str, Any],
    memory: dict[str, Any],
    cfg: SandboxConfig,
) -> bytes:
    """The pickled reply to one call. A call whose memory or result is too large to check or to
    pickle under the memory limit (`memory['x'] = 'a' * 300_000_000`) gets a `runtime` error
    instead of killing the worker with a traceback on the learner's terminal."""
    try:
        return pickle.dumps(_run(compiled, view, memory, cfg))
    except MemoryError:
        pass
    memory.clear()  # the call's large values go before anything else is allocated
    message = (
        f"MemoryError: the step's memory or returned value does not fit the memory limit of "
        f"{cfg.memory_mb} MB once it is sent back"
    )
    return pickle.dumps(("runtime", message, {}, 0))


def _run(
    compiled: tuple[CodeType | None, str | None],
    view: dict[str, Any],
    memory: dict[str, Any],
    cfg: SandboxConfig,
) -> tuple[str | None, Any, dict[str, Any], int]:
    """One call in the worker: (error kind or None, the word or the error, memory, lines)."""
    code, problem = compiled
    if code is None:
        return "compile", problem, memory, 0
    _limit_cpu(cfg.cpu_s)
    counter = _LineCounter(cfg.line_budget)
    namespace = _namespace()
    kind: str | None = None
    sys.settrace(counter.trace)
    try:
        exec(code, namespace)
        value = namespace["step"](MappingProxyType(view), memory)
    except MemoryError:
        kind, value = "runtime", f"MemoryError: over the memory limit of {cfg.memory_mb} MB"
    except BaseException as error:  # the coded action's own failure, reported as data
        kind, value = "runtime", _describe(error)
    finally:
        sys.settrace(None)
    if counter.exceeded:  # whatever the code caught of the budget's exception
        kind, value = "budget", counter.message
    # Only plain data goes back to the parent, whatever the call did to the memory.
    if (problem := _not_plain(memory)) is not None:
        memory = {}
        if kind is None:
            kind, value = "runtime", f"memory must hold plain data only: {problem}"
    if kind is None and not isinstance(value, str):
        kind = "invalid_action"
        value = f"step returned {value!r:.60} ({type(value).__name__}), not an action word"
    return kind, value, memory, counter.lines


class _BudgetExceeded(BaseException):
    """Raised inside the coded action when its line budget is spent."""


class _LineCounter:
    """A `sys.settrace` function counting lines in the coded action's frames only."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.lines = 0
        self.exceeded = False
        self.message = f"line budget of {budget} exceeded"

    def trace(self, frame: Any, event: str, arg: Any) -> Callable | None:
        if event != "call" or frame.f_code.co_filename != FILENAME:
            return None  # the guards' and builtins' frames are not traced line by line
        return self._line

    def _line(self, frame: Any, event: str, arg: Any) -> Callable:
        if event == "line":
            self.lines += 1
            # Every line past the budget raises again, so `except BaseException: pass` in a
            # loop cannot run on (and the result says "budget" whatever the code caught).
            if self.budget is not None and self.lines > self.budget:
                self.exceeded = True
                raise _BudgetExceeded(self.message)
        return self._line


def _namespace() -> dict[str, Any]:
    """The globals of one call: the safe builtins and RestrictedPython's guards."""
    return {
        "__builtins__": {**safe_builtins, **_EXTRA_BUILTINS, "math": math},
        "__name__": "coded_action",
        "_getattr_": safer_getattr,
        "_getitem_": default_guarded_getitem,
        "_getiter_": default_guarded_getiter,
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
        "_unpack_sequence_": guarded_unpack_sequence,
        "_write_": full_write_guard,
        "_inplacevar_": _inplacevar,
        "_apply_": _apply,
        "_print_": PrintCollector,  # print() is collected and dropped, never written out
    }


def _inplacevar(op: str, target: Any, value: Any) -> Any:
    return _INPLACE[op](target, value)


def _apply(function: Callable, *args: Any, **kwargs: Any) -> Any:
    return function(*args, **kwargs)


def _not_plain(value: Any, depth: int = 0) -> str | None:
    """Why `value` is not plain data (None, bool, int, float, str, and tuples, lists, sets and
    dicts of them), or None when it is."""
    if depth > 20:
        return "nested more than 20 levels deep"
    if isinstance(value, _PLAIN_SCALARS):
        return None
    if isinstance(value, dict):
        items = [item for pair in value.items() for item in pair]
    elif isinstance(value, (tuple, list, set, frozenset)):
        items = list(value)
    else:
        return f"found a {type(value).__name__}"
    for item in items:
        if (problem := _not_plain(item, depth + 1)) is not None:
            return problem
    return None


def _describe(error: BaseException) -> str:
    """`Type: message (line N)`, N the coded action's line where it was raised."""
    text = _first_line(traceback.format_exception_only(type(error), error)[-1])
    lines = [
        frame.lineno for frame in traceback.extract_tb(error.__traceback__)
        if frame.filename == FILENAME
    ]  # fmt: skip
    return f"{text} (line {lines[-1]})" if lines else text


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _limit_cpu(seconds: int) -> None:
    """At most `seconds` more CPU seconds for the worker (RLIMIT_CPU counts since its start)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime) + seconds
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _limit_memory(megabytes: int) -> None:
    """At most `megabytes` more address space than the worker has now (it has already loaded
    its interpreter and whatever the parent's main module imports, which spawn re-imports)."""
    with open("/proc/self/statm") as statm:
        current = int(statm.read().split()[0]) * resource.getpagesize()
    limit = current + megabytes * 2**20
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
