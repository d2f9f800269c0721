"""TLC, the TLA+ model checker: finding a usable ``tla2tools.jar`` and running one model.

Where the jar comes from, first found wins:

1. ``$TLA2TOOLS_JAR``: when set, only that file is considered;
2. ``.cache/tla2tools.jar`` in the checkout;
3. ``../shared/tools/tla2tools.jar`` beside the checkout (a build from the tlaplus sources);
4. a download of the pinned v1.7.4 release into ``.cache/``, kept only if its SHA-256 is the
   pinned one (``TLA2TOOLS_NO_DOWNLOAD=1`` skips the attempt).

A jar found on disk is accepted by what it is, not by its checksum, since a build from the
sources cannot reproduce the release's bytes: its manifest names version 1.7.4 or later, it
holds the parser (``tla2sany.SANY``) and the checker (``tlc2.TLC``), and it gets a trivial
spec right (one model that must pass with a known state count, one that must fail on a
named invariant). A jar that fails any of these is refused with the reason, and the caller
says plainly that nothing was model-checked.

A model is run with ``-workers 1``: TLC's breadth-first search with more workers may reach a
state first at a deeper level than its least one, and the depth-bounded models
(``Bounded`` in ``tla/MCCheckpointOwnership.tla``) would then count and cover a different
set of states from run to run. With one worker the counts are the same on every run.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

from attrs import frozen

ROOT = Path(__file__).resolve().parent.parent
TLA_DIR = ROOT / "tla"
CACHE_JAR = ROOT / ".cache" / "tla2tools.jar"
SHARED_JAR = ROOT.parent / "shared" / "tools" / "tla2tools.jar"
MIN_VERSION = (1, 7, 4)
TLC_VERSION = "1.7.4"
TLC_URL = f"https://github.com/tlaplus/tlaplus/releases/download/v{TLC_VERSION}/tla2tools.jar"
TLC_SHA256 = "936a262061c914694dfd669a543be24573c45d5aa0ff20a8b96b23d01e050e88"
"""The v1.7.4 release jar's SHA-256 as other projects pin it (v1.8.0's asset is rolling,
so it cannot be pinned). Used only for a download: no machine here can reach the release."""

# TLC's exit codes (tlc2.output.EC.ExitStatus): success, and a safety violation.
EXIT_OK = 0
EXIT_SAFETY = 12


def fetch_release(dest: Path, timeout: float = 20.0) -> str | None:
    """Fill the cache with the pinned release; None if it worked, else why not. Nothing
    is kept unless its SHA-256 is the pinned one."""
    import urllib.request

    try:
        with urllib.request.urlopen(TLC_URL, timeout=timeout) as r:
            data = r.read()
    except Exception as err:  # offline, proxy, DNS: all mean the same here
        return f"downloading {TLC_URL} failed: {type(err).__name__}: {err}"
    digest = hashlib.sha256(data).hexdigest()
    if digest != TLC_SHA256:
        return f"the download has SHA-256 {digest}, not the pinned {TLC_SHA256}: not kept"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return None


def manifest_version(jar: Path) -> tuple[tuple[int, ...] | None, str]:
    """The version a jar's manifest names (``Implementation-Version``, else ``X-Git-Tag``),
    and the text it was read from; None when there is none or the file is no jar."""
    try:
        with zipfile.ZipFile(jar) as z:
            text = z.read("META-INF/MANIFEST.MF").decode("utf-8", "replace")
    except (OSError, KeyError, zipfile.BadZipFile) as err:
        return None, f"no readable manifest ({type(err).__name__}: {err})"
    for key in ("Implementation-Version", "X-Git-Tag"):
        m = re.search(rf"^{key}:\s*v?(\d+)\.(\d+)\.(\d+)([^\r\n]*)", text, re.M)
        if m:
            return tuple(
                int(m.group(i)) for i in (1, 2, 3)
            ), f"{key}: {m.group(0).split(':', 1)[1].strip()}"
    return None, "the manifest names no version"


_CLASSES = ("tla2sany/SANY.class", "tlc2/TLC.class")

_SELF_TEST = """---- MODULE SelfTest ----
EXTENDS Naturals
VARIABLE x
Init == x = 0
Next == x < 3 /\\ x' = x + 1
Within == x <= 3
Below == x < 2
====
"""


@functools.cache
def _self_test(jar: str, size: int, mtime: float) -> str | None:
    """None when the jar checks a four-state counter right: ``Within`` holds in exactly 4
    distinct states, ``Below`` is violated. Otherwise what went wrong."""
    del size, mtime  # part of the cache key: a replaced jar is tested again
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "SelfTest.tla").write_text(_SELF_TEST)
        for inv, want in (("Within", "pass"), ("Below", "violates Below")):
            cfg = Path(tmp, f"{inv}.cfg")
            cfg.write_text(f"INIT Init\nNEXT Next\nINVARIANT {inv}\nCHECK_DEADLOCK FALSE\n")
            r = run(Path(jar), Path(tmp, "SelfTest.tla"), cfg, timeout=120)
            if want == "pass" and not (r.passed and r.distinct == 4):
                return f"its TLC did not find the 4 states of a trivial spec: {r.describe()}"
            if want != "pass" and r.violated != ("Below",):
                return f"its TLC did not catch a violated invariant: {r.describe()}"
    return None


def accept(jar: Path) -> str | None:
    """None if ``jar`` is a usable TLC, else why not."""
    if not jar.is_file():
        return f"{jar} is not a file"
    version, said = manifest_version(jar)
    if version is None:
        return f"{jar}: {said}"
    if version < MIN_VERSION:
        return f"{jar} is TLA+ tools {said}, older than v{TLC_VERSION}"
    with zipfile.ZipFile(jar) as z:
        names = set(z.namelist())
    missing = [c for c in _CLASSES if c not in names]
    if missing:
        return f"{jar} lacks {', '.join(missing)}: not the TLA+ tools"
    if shutil.which("java") is None:
        return "java is not installed (apt-get install openjdk-17-jre-headless)"
    st = jar.stat()
    bad = _self_test(str(jar.resolve()), st.st_size, st.st_mtime)
    return f"{jar}: {bad}" if bad else None


def find_jar() -> tuple[Path | None, str]:
    """The TLC jar to use and where it came from, or None and why there is none."""
    named = os.environ.get("TLA2TOOLS_JAR", "").strip()
    if named:
        why = accept(Path(named))
        if why is None:
            return Path(named), describe_jar(Path(named))
        return None, f"TLC is not available: TLA2TOOLS_JAR={named} is refused: {why}"
    refused = []
    for jar in (CACHE_JAR, SHARED_JAR):
        if jar.is_file():
            why = accept(jar)
            if why is None:
                return jar, describe_jar(jar)
            refused.append(why)
    fetch_error = ""
    if not os.environ.get("TLA2TOOLS_NO_DOWNLOAD"):
        fetch_error = fetch_release(CACHE_JAR) or ""
        if not fetch_error:
            why = accept(CACHE_JAR)
            if why is None:
                return CACHE_JAR, describe_jar(CACHE_JAR)
            refused.append(why)
    return None, (
        f"TLC is not available: no usable tla2tools.jar at $TLA2TOOLS_JAR, {CACHE_JAR} or "
        f"{SHARED_JAR}"
        + (f" ({'; '.join(refused)})" if refused else "")
        + f". The pinned v{TLC_VERSION} release ({TLC_URL}, sha256 in model_tests/tlc.py) "
        "could not be fetched"
        + (f": {fetch_error}" if fetch_error else " (TLA2TOOLS_NO_DOWNLOAD is set)")
        + ". Put a jar there or set TLA2TOOLS_JAR."
    )


def describe_jar(jar: Path) -> str:
    _, said = manifest_version(jar)
    return f"{jar} ({said})"


@frozen
class Model:
    """One ``tla/*.cfg``: its module, what TLC must find, and the state count recorded
    for it. The config says these in comment lines: ``\\* module: MCSmall`` (default: the
    config's own name), ``\\* expect: pass`` or ``\\* expect: violates NoDanglingInv``,
    ``\\* states: 4363`` (distinct states TLC reports with one worker: all of them for a
    passing model, those found when it stopped for a failing one). A model run as TLC
    simulation instead of a breadth-first search says so, with its fixed seed and the
    number and depth of behaviours: ``\\* simulate: num=3000 depth=30 seed=1``; its count
    is then the states TLC checked along those behaviours."""

    module: Path
    cfg: Path
    expect: str
    states: int | None
    simulate: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.cfg.stem

    @property
    def must_fail(self) -> bool:
        return self.expect.startswith("violates")

    @property
    def invariant(self) -> str:
        return self.expect.removeprefix("violates").strip()


def models(folder: Path = TLA_DIR) -> list[Model]:
    out = []
    for cfg in sorted(folder.glob("*.cfg")):
        text = cfg.read_text()
        mod = re.search(r"\\\*\s*module:\s*(\w+)", text)
        exp = re.search(r"\\\*\s*expect:\s*([^\n]+)", text)
        states = re.search(r"\\\*\s*states:\s*([\d,]+)", text)
        sim = re.search(r"\\\*\s*simulate:\s*([^\n]+)", text)
        out.append(
            Model(
                folder / f"{mod.group(1) if mod else cfg.stem}.tla",
                cfg,
                exp.group(1).strip() if exp else "pass",
                int(states.group(1).replace(",", "")) if states else None,
                _simulate_args(sim.group(1)) if sim else (),
            )
        )
    return out


def _simulate_args(spec: str) -> tuple[str, ...]:
    opts = dict(part.split("=", 1) for part in spec.split())
    if set(opts) != {"num", "depth", "seed"} or not all(v.isdigit() for v in opts.values()):
        raise ValueError(f"'\\* simulate: {spec}': want num=N depth=N seed=N")
    return ("-simulate", f"num={opts['num']}", "-depth", opts["depth"], "-seed", opts["seed"])


@frozen
class Run:
    """What one TLC run reported."""

    code: int
    distinct: int | None
    generated: int | None
    violated: tuple[str, ...]
    completed: bool
    deadlock: bool
    seconds: float
    tail: tuple[str, ...]
    simulated: bool = False
    """A simulation: ``distinct`` is then the number of states checked along its behaviours."""

    @property
    def passed(self) -> bool:
        return self.code == EXIT_OK and self.completed and not self.violated and not self.deadlock

    def describe(self) -> str:
        what = (
            "no violation"
            if self.passed
            else f"violated {', '.join(self.violated)}"
            if self.violated
            else "deadlock reached"
            if self.deadlock
            else f"TLC failed (exit {self.code}): {self.tail[-1] if self.tail else 'no output'}"
        )
        n = f"{self.distinct:,}" if self.distinct is not None else "?"
        return (
            f"{what}, {n} {'states checked (simulation)' if self.simulated else 'distinct states'}"
        )


def _count(pattern: str, out: str) -> int | None:
    found = re.findall(pattern, out)
    return int(found[-1].replace(",", "")) if found else None


def run(
    jar: Path,
    module: Path,
    cfg: Path,
    *,
    timeout: float = 3600,
    workers: int = 1,
    simulate: tuple[str, ...] = (),
) -> Run:
    """Run TLC on one model in the model's folder, with a fresh metadata directory: a
    breadth-first search, or the simulation ``simulate`` gives (``_simulate_args``)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as meta:
        # TLC writes the standard modules (TLC.tla, Naturals.tla...) into java.io.tmpdir
        # before parsing them: two runs sharing /tmp can parse each other's half-written
        # copy (exit 150, "parse error"). Each run gets its own.
        args = [
            "java",
            "-XX:+UseParallelGC",
            f"-Djava.io.tmpdir={meta}",
            "-cp",
            str(jar),
            "tlc2.TLC",
            "-workers",
            str(workers),
            "-metadir",
            meta,
            *simulate,
            "-config",
            cfg.name,
            module.name,
        ]
        try:
            proc = subprocess.run(
                args, cwd=module.parent, capture_output=True, text=True, timeout=timeout
            )
            code, out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as err:
            # The partial output comes back as bytes even in text mode.
            partial = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else ""
            code, out = -1, f"{partial}\nTLC did not finish within {timeout:g} s"
    violated = tuple(sorted(set(re.findall(r"Invariant (\w+) is violated", out))))
    if simulate:  # TLC's simulation says neither "completed" nor "distinct"
        states = _count(r"([\d,]+) states checked", out)
        completed = code == EXIT_OK and "Finished in" in out and "Error:" not in out
    else:
        states = _count(r"([\d,]+) distinct states found", out)
        completed = "Model checking completed. No error has been found." in out
    return Run(
        code=code,
        distinct=states,
        generated=_count(r"([\d,]+) states generated", out),
        violated=violated,
        completed=completed,
        deadlock="Deadlock reached" in out,
        seconds=time.perf_counter() - t0,
        tail=tuple(out.strip().splitlines()[-25:]),
        simulated=bool(simulate),
    )


def judge(model: Model, r: Run) -> tuple[bool, str]:
    """Whether a run is what the model expects, and a one-line summary with its count."""
    if model.must_fail:
        ok = r.code == EXIT_SAFETY and r.violated == (model.invariant,)
        summary = f"must fail on {model.invariant}: {r.describe()}"
    else:
        ok = r.passed
        summary = r.describe()
    if ok and model.states is not None and r.distinct != model.states:
        return False, (
            f"{summary}, but {model.cfg.name} records {model.states:,}: the spec's state "
            "space changed; if that is meant, update the count there and in tla/README.md"
        )
    if model.states is None:  # a generated trace model: its count is not the point
        summary += " (no count recorded)"
    return ok, summary
