"""`artstore warm`: fill the store from a CI job so every process after it starts warm.

Two ways in. `warm -- CMD` runs CMD with the store in write mode in CMD and in
every Python process it starts, without changing CMD: an environment variable
plus a startup hook (`_activate/sitecustomize.py`) that activates the store
when, and only when, a child imports JAX. `warm MODULE:FUNCTION` lowers and
compiles the listed specializations in worker processes without running them.

This module is the parent's side: it never imports JAX (a parent holding a GPU
client would take memory the children need). Children leave one JSON record
each in a report directory; the parent adds them up into the report.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

import click

from artifactstore import config as _config
from artifactstore.errors import ArtstoreError, one_line
from artifactstore.fingerprint import Fingerprint
from artifactstore.sizes import format_seconds, format_size

ENV_VAR = "ARTSTORE_WARM"  # same as _warm_child.ENV_VAR (not imported: it imports JAX glue)
ACTIVATE_DIR = Path(__file__).resolve().parent / "_activate"
FINGERPRINT_FIELDS = (
    "platform",
    "device_kind",
    "device_count",
    "platform_version",
    "jax_version",
    "jaxlib_version",
    "cpu_arch",
    "cpu_features",
    "os",
    "version",
)


class WarmError(ArtstoreError):
    """`artstore warm` cannot start or its input is wrong; one line for the user."""


# -- the report -------------------------------------------------------------
@dataclass
class Report:
    """What one `artstore warm` run did; text for people, JSON for CI."""

    what: str
    added: int = 0
    present: int = 0
    failed: int = 0
    bytes_uploaded: int = 0
    compile_secs_added: float = 0.0
    compile_secs_present: float = 0.0
    fingerprints: dict[str, dict[str, Any]] = field(default_factory=dict)
    expected_digest: str | None = None
    problems: list[str] = field(default_factory=list)  # each makes `warm` exit 1
    notes: list[str] = field(default_factory=list)
    items: list[dict[str, Any]] = field(default_factory=list)
    processes: int = 0
    exit_code: int | None = None
    duplicates: int = 0
    elapsed_secs: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "exit_code": self.exit_code,
            "processes": self.processes,
            "added": self.added,
            "present": self.present,
            "failed": self.failed,
            "duplicates": self.duplicates,
            "bytes_uploaded": self.bytes_uploaded,
            "compile_secs_added": self.compile_secs_added,
            "compile_secs_present": self.compile_secs_present,
            "compile_secs_saved_per_process": self.compile_secs_added + self.compile_secs_present,
            "fingerprints": list(self.fingerprints.values()),
            "expected_fingerprint": self.expected_digest,
            "problems": self.problems,
            "notes": self.notes,
            "items": self.items,
            "elapsed_secs": self.elapsed_secs,
        }

    def render(self) -> str:
        lines = [f"artstore warm: {self.what}, in {format_seconds(self.elapsed_secs)}"]
        if self.exit_code is not None:
            lines.append(f"  {'command exit code':<20}{self.exit_code}")
            lines.append(f"  {'processes':<20}{self.processes} with JAX and the store active")
        dup = f" ({self.duplicates} duplicates skipped)" if self.duplicates else ""
        saved = self.compile_secs_added + self.compile_secs_present
        rows = [
            ("entries added", f"{self.added} (compiled and stored)"),
            ("already present", f"{self.present} (loaded, not compiled){dup}"),
            ("bytes uploaded", format_size(self.bytes_uploaded)),
            (
                "compile time saved",
                f"{format_seconds(saved)} per fresh process on this "
                f"target ({format_seconds(self.compile_secs_added)} added now)",
            ),
        ]
        if self.items:
            rows.insert(2, ("failed", str(self.failed)))
        lines += [f"  {k:<20}{v}" for k, v in rows]
        if not self.fingerprints:
            lines.append(f"  {'fingerprint':<20}(nothing compiled or loaded)")
        for fp in self.fingerprints.values():
            mark = " (the expected target)" if fp["digest"] == self.expected_digest else ""
            lines.append(f"  {'fingerprint':<20}{describe_fingerprint(fp)}{mark}")
        for item in self.items:
            if item["status"] == "failed":
                lines.append(f"  FAILED {item['name']}: {item['error']}")
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)


def describe_fingerprint(fp: dict[str, Any]) -> str:
    return (
        f"{fp['digest'][:12]}: {fp['platform']} {fp['device_kind']!r} x{fp['device_count']}, "
        f"jax {fp['jax_version']}, jaxlib {fp['jaxlib_version']}, {fp['cpu_arch']}"
    )


# -- the expected target ----------------------------------------------------
def load_expected(text: str) -> dict[str, Any]:
    """`--expect-fingerprint`: a file or inline JSON as `artstore fingerprint --json` prints."""
    source = text.strip()
    if not source.startswith("{"):
        path = Path(source).expanduser()
        try:
            source = path.read_text()
        except OSError as exc:
            raise WarmError(
                f"cannot read --expect-fingerprint file {text!r}: {exc.strerror or one_line(exc)}"
            ) from None
    hint = "use the output of `artstore fingerprint --json` on a target node"
    try:
        data = json.loads(source)
    except json.JSONDecodeError as exc:
        raise WarmError(f"--expect-fingerprint is not valid JSON ({exc.msg}): {hint}") from None
    if not isinstance(data, dict):
        raise WarmError(f"--expect-fingerprint is not a JSON object: {hint}")
    try:
        fp = Fingerprint.from_dict(data)
    except TypeError as exc:
        raise WarmError(f"--expect-fingerprint is not a fingerprint ({exc}): {hint}") from None
    return {**fp.to_dict(), "digest": fp.digest}


def fingerprint_differences(here: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """One phrase per field that differs, e.g. `device_kind: 'cpu' here, 'H200' expected`."""
    out = []
    for name in FINGERPRINT_FIELDS:
        a, b = here.get(name), expected.get(name)
        if a == b:
            continue
        if name == "cpu_features":
            missing = sorted(set(b or ()) - set(a or ()))
            extra = sorted(set(a or ()) - set(b or ()))
            parts = ([f"missing here {' '.join(missing)}"] if missing else []) + (
                [f"extra here {' '.join(extra)}"] if extra else []
            )
            out.append(f"cpu_features: {'; '.join(parts)}")
        else:
            out.append(f"{name}: {a!r} here, {b!r} expected")
    return out


def check_expected(here: dict[str, Any], expected: dict[str, Any]) -> None:
    diffs = fingerprint_differences(here, expected)
    if diffs:
        raise WarmError(
            "this host does not match the expected target, so what it compiles "
            f"would never be used there: {'; '.join(diffs)}"
        )


def host_fingerprint_via_subprocess(env: dict[str, str]) -> dict[str, Any]:
    """This host's fingerprint from a short-lived process, so no GPU client stays open here."""
    proc = subprocess.run(
        [sys.executable, "-m", "artifactstore", "fingerprint", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise WarmError(f"cannot compute this host's fingerprint: {tail}")
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


# -- shared setup -----------------------------------------------------------
def _child_env(overrides: dict[str, Any]) -> dict[str, str]:
    """Our environment with the store settings of the command line, in write mode."""
    env = dict(os.environ)
    env.pop(ENV_VAR, None)
    for option, var in (("url", "URL"), ("index", "INDEX"), ("namespace", "NAMESPACE")):
        if overrides.get(option) is not None:
            env[_config.ENV_PREFIX + var] = str(overrides[option])
    env["ARTSTORE_READ_ONLY"] = "0"
    env["ARTSTORE_MIN_COMPILE_SECS"] = "0"  # warming stores everything it compiles
    # Ask the shared store itself, not this host's local copies: an entry gone
    # from the store (gc) must be uploaded again.
    env["ARTSTORE_LOCAL_TIER"] = "off"
    return env


def check_store(settings: _config.Settings) -> str:
    """Open the store once before running anything: fail in seconds, not after the job."""
    from artifactstore.store import Store

    store = Store.open(settings)
    try:
        return store.describe()
    finally:
        store.close()


# -- warm -- CMD --------------------------------------------------------------
def run_command(
    argv: list[str], overrides: dict[str, Any], expected: dict[str, Any] | None
) -> Report:
    env = _child_env(overrides)
    if expected is not None:
        check_expected(host_fingerprint_via_subprocess(env), expected)
    if shutil.which(argv[0], path=env.get("PATH")) is None and not os.path.exists(argv[0]):
        raise WarmError(f"command not found: {argv[0]!r}")
    report_dir = Path(tempfile.mkdtemp(prefix="artstore-warm-"))
    env[ENV_VAR] = str(report_dir)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ACTIVATE_DIR), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    started = time.monotonic()
    try:
        code = _run_forwarding_signals(argv, env)
        report = aggregate(report_dir, what=shlex.join(argv)[:200])
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)
    report.exit_code = code
    report.elapsed_secs = time.monotonic() - started
    if report.processes == 0 and code == 0:
        report.problems.append(
            "nothing was warmed: no Python process started by the command imported JAX with "
            "artifactstore importable (another interpreter or virtualenv? python -E or -I?)"
        )
    _check_warmed_target(report, expected)
    return report


def _run_forwarding_signals(argv: list[str], env: dict[str, str]) -> int:
    """Run CMD; pass SIGTERM on (CI cancels), let Ctrl-C reach it, and wait for its exit."""
    try:
        proc = subprocess.Popen(argv, env=env)
    except OSError as exc:
        raise WarmError(f"cannot run {argv[0]!r}: {exc.strerror or one_line(exc)}") from None
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:
                continue  # the child got the same SIGINT; report once it has exited
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code if code >= 0 else 128 - code


def aggregate(report_dir: Path, *, what: str) -> Report:
    """Add up what the activated processes left in `report_dir`.

    Per process: `PID.started` when it activated, `PID.events` (one JSON line per
    entry stored or found, written as it happens) and `PID.json` at a normal exit
    (counters, whether uploads finished). A process killed before its exit
    leaves no `PID.json`, but what it stored is in its events.
    """
    report = Report(what=what)
    pids = sorted({p.name.split(".")[0] for p in report_dir.glob("*.started")}, key=int)
    report.processes = len(pids)
    silent = []
    for pid in pids:
        started = _read_json(report_dir / f"{pid}.started") or {}
        final = _read_json(report_dir / f"{pid}.json")
        argv = shlex.join(started.get("argv", []))[:80]
        put_errors = []
        for event in _read_events(report_dir / f"{pid}.events"):
            kind = event.get("kind")
            if kind == "fingerprint":
                report.fingerprints[event["digest"]] = {
                    k: v for k, v in event.items() if k != "kind"
                }
            elif kind in ("added", "present"):
                report.bytes_uploaded += int(event.get("bytes", 0))
                if kind == "added":
                    report.added += 1
                    report.compile_secs_added += float(event.get("compile_secs", 0.0))
                else:
                    report.present += 1
                    report.compile_secs_present += float(event.get("compile_secs", 0.0))
            elif kind == "put_error":
                put_errors.append(f"{event.get('module')}: {event.get('error')}")
        if put_errors:
            report.problems.append(
                f"pid {pid} ({argv}): {len(put_errors)} upload(s) failed, "
                f"e.g. {put_errors[0]} (writer credentials?)"
            )
        if final is None:
            silent.append(pid)
            continue
        if not final.get("active"):
            report.problems.append(
                f"pid {pid} ({argv}): the store was unavailable; its "
                "compiles were not stored (see its warning above)"
            )
        if not final.get("flushed", True):
            report.problems.append(
                f"pid {pid} ({argv}): uploads did not finish within "
                "ARTSTORE_FLUSH_TIMEOUT; some entries were not stored"
            )
    if silent:
        report.notes.append(
            f"{len(silent)} process(es) (pid {', '.join(silent[:5])}) were ended before a "
            "normal exit (e.g. multiprocessing's Pool.terminate): what they stored is counted; "
            "a compile in progress when they ended was lost"
        )
    return report


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_events(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:  # a line cut short by a kill
            continue
    return events


def _check_warmed_target(report: Report, expected: dict[str, Any] | None) -> None:
    if expected is None:
        return
    report.expected_digest = expected["digest"]
    if report.fingerprints and expected["digest"] not in report.fingerprints:
        report.problems.append(
            f"nothing was warmed for the expected target fingerprint {expected['digest'][:12]}"
        )


# -- warm MODULE:FUNCTION ---------------------------------------------------
class _Worker:
    """One `python -m artifactstore._warm_worker` process and its protocol pipe."""

    def __init__(self, target: str, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._log_file = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "artifactstore._warm_worker", target],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
            bufsize=1,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._stdin: IO[str] = self.proc.stdin
        self._stdout: IO[str] = self.proc.stdout

    def recv(self) -> dict[str, Any] | None:
        line = self._stdout.readline()
        return json.loads(line) if line else None

    def send(self, index: int) -> bool:
        try:
            self._stdin.write(f"{index}\n")
            self._stdin.flush()
            return True
        except OSError:
            return False

    def close(self, timeout: float = 900) -> None:
        try:
            self._stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log_file.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log_file.close()

    def death(self) -> str:
        code = self.proc.wait()
        tail = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        last = f": {tail[-1].strip()[:200]}" if tail else ""
        return f"worker process exited with code {code}{last}"


Progress = Callable[[dict[str, Any], int, int], None]


class ProgressDisplay:
    """A progress bar on a terminal; one line per specialization in a CI log."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.hits = self.compiled = self.failed = 0
        self.compile_secs = 0.0
        self._bar: Any = None

    def _status(self, _: Any = None) -> str:
        return (
            f"hits {self.hits}  compiled {self.compiled}  failed {self.failed}  "
            f"compile {self.compile_secs:.1f} s"
        )

    def start(self, total: int) -> Progress:
        if self.tty:
            self._bar = click.progressbar(
                length=total,
                label="warming",
                file=self.stream,
                show_pos=True,
                item_show_func=self._status,
            )
            self._bar.__enter__()
        return self.update

    def update(self, res: dict[str, Any], done: int, total: int) -> None:
        status = res["status"]
        if status == "present":
            self.hits += 1
        elif status == "compiled":
            self.compiled += 1
            self.compile_secs += res["compile_secs"]
        else:
            self.failed += 1
        if self._bar is not None:
            self._bar.update(1, self._status())
            return
        secs = res["compile_secs"]
        texts = {"compiled": f"compiled in {secs:.2f} s", "present": f"saves {secs:.2f} s"}
        detail = texts.get(status, res["error"])
        click.echo(
            f"[{done}/{total}] {status:<8} {res['name']}  {detail}  ({self._status()})",
            file=self.stream,
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None


def run_specs(
    target: str,
    jobs: int,
    overrides: dict[str, Any],
    expected: dict[str, Any] | None,
    progress: Callable[[int], Progress],
) -> Report:
    """Compile every specialization FUNCTION lists in `jobs` worker processes."""
    from artifactstore._warm_worker import TARGET_RE

    if not TARGET_RE.match(target):
        raise WarmError(
            f"invalid target {target!r}: use MODULE:FUNCTION "
            "(e.g. mypkg.shapes:specializations) or -- CMD [ARGS...]"
        )
    env = _child_env(overrides)
    if jobs > 1:  # compile-only workers need no preallocated device memory
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    started = time.monotonic()
    logs = Path(tempfile.mkdtemp(prefix="artstore-warm-"))
    pool: _Pool | None = None
    try:
        pool = _Pool(target, env, logs, jobs)
        ready = pool.first_ready(expected)
        names = pool.names
        report = Report(
            what=f"{len(names)} specializations of {target} "
            f"({jobs} worker{'s' if jobs > 1 else ''})"
        )
        report.duplicates = int(ready.get("duplicates", 0))
        fp = ready["fingerprint"]
        report.fingerprints[fp["digest"]] = {
            k: fp[k]
            for k in (
                "digest",
                "platform",
                "device_kind",
                "device_count",
                "jax_version",
                "jaxlib_version",
                "cpu_arch",
            )
        }
        results = pool.results(progress(len(names)))
    except BaseException:
        shutil.rmtree(logs, ignore_errors=True)
        raise
    finally:
        if pool is not None:
            pool.kill()
    for index, name in enumerate(names):
        res = results.get(index) or {
            "name": name,
            "status": "failed",
            "compile_secs": 0.0,
            "bytes": 0,
            "error": "not attempted: no worker left",
        }
        report.items.append(res)
        if res["status"] == "compiled":
            report.added += 1
            report.compile_secs_added += res["compile_secs"]
            report.bytes_uploaded += res["bytes"]
        elif res["status"] == "present":
            report.present += 1
            report.compile_secs_present += res["compile_secs"]
        else:
            report.failed += 1
    if report.failed:  # the workers' own output, for whoever debugs the failures
        report.problems.append(f"worker logs kept in {logs}")
    else:
        shutil.rmtree(logs, ignore_errors=True)
    report.elapsed_secs = time.monotonic() - started
    _check_warmed_target(report, expected)
    return report


class _Pool:
    """`jobs` workers; work starts as soon as the first is ready, the others join as they are.

    Item indices go to whichever worker is free. A worker that dies takes down
    only the item it was on: it is reported failed and a fresh worker takes its
    place for the rest.
    """

    def __init__(self, target: str, env: dict[str, str], logs: Path, jobs: int) -> None:
        self.target, self.env, self.logs = target, env, logs
        self.workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._go = threading.Event()
        self._abort = threading.Event()
        self.names: list[str] = []
        self.threads = [
            threading.Thread(target=self._drive, args=(i,), daemon=True) for i in range(jobs)
        ]
        for t in self.threads:
            t.start()

    def _spawn(self, name: str) -> _Worker:
        with self._lock:
            worker = _Worker(self.target, self.env, self.logs / f"{name}.log")
            self.workers.append(worker)
        return worker

    def kill(self) -> None:
        self._abort.set()
        self._go.set()
        with self._lock:
            workers = list(self.workers)
        for w in workers:
            w.kill()

    def first_ready(self, expected: dict[str, Any] | None) -> dict[str, Any]:
        """The first worker's announcement (names, fingerprint), checked; then work starts."""
        starting, death = len(self.threads), ""
        while True:
            kind, msg = self._events.get()
            if kind == "died":
                starting -= 1
                death = msg
                if starting == 0:
                    raise WarmError(f"could not start a warm worker: {death}")
                continue
            if "fatal" in msg:
                raise WarmError(str(msg["fatal"]))
            if expected is not None:
                check_expected(msg["fingerprint"], expected)
            self.names = list(msg["ready"])
            for index in range(len(self.names)):
                self._todo.put(index)
            self._go.set()
            announced: dict[str, Any] = msg
            return announced

    def _drive(self, slot: int) -> None:
        worker = self._spawn(f"worker{slot}")
        ready = worker.recv()
        self._events.put(("died", worker.death()) if ready is None else ("ready", ready))
        self._go.wait()
        if self._abort.is_set() or ready is None or "fatal" in ready:
            self._events.put(("done", None))
            return
        if ready["ready"] != self.names:
            self._events.put(
                (
                    "fatal",
                    "FUNCTION listed different specializations in "
                    "different worker processes: it must return the same list "
                    "every time it is called",
                )
            )
            return
        while not self._abort.is_set():
            try:
                index = self._todo.get_nowait()
            except queue.Empty:
                worker.close()
                break
            reply = worker.recv() if worker.send(index) else None
            if reply is not None:
                self._events.put(("result", (index, reply)))
                continue
            failure = {
                "name": self.names[index],
                "status": "failed",
                "compile_secs": 0.0,
                "bytes": 0,
                "error": worker.death(),
            }
            self._events.put(("result", (index, failure)))
            worker = self._spawn(f"worker{slot}-after-{index}")
            ready = worker.recv()
            if ready is None or "fatal" in ready:
                break
        self._events.put(("done", None))

    def results(self, progress: Progress) -> dict[int, dict[str, Any]]:
        """Collect every result, reporting each as it arrives."""
        results: dict[int, dict[str, Any]] = {}
        running = len(self.threads)
        while running:
            kind, msg = self._events.get()
            if kind == "done":
                running -= 1
            elif kind == "fatal":
                raise WarmError(msg)
            elif kind == "result":
                index, res = msg
                res["name"] = self.names[index]
                results[index] = res
                progress(res, len(results), len(self.names))
        return results
