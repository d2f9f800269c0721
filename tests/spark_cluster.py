"""A Spark standalone cluster on this machine whose two workers are two hosts to Spark:
the master on 127.0.0.1, one worker on 127.0.0.2 and one on 127.0.0.3 (the whole of
127.0.0.0/8 is the loopback on Linux), each with one core and its own executor JVM.

Why not ``local-cluster``: Spark never launches a speculative copy of a task on a host
where an attempt of that task ran (``TaskSetManager.dequeueTaskFromList``:
``!(speculative && hasAttemptOnHost(index, host))``, with no setting to turn it off), and
``local-cluster`` starts every executor on the one host name of the machine, so it never
speculates. Two workers bound to two loopback addresses register two hosts, and the
speculative copy runs on the other one. Both executors share this machine's disk, so the
subtasks' local RocksDBs (``<work>/local``) are where either executor looks.

The driver is a separate process (``ckpt stream --master spark://...``) with the
environment of ``driver_env``. Each daemon and each driver runs under the supervisor of
``tests.supervised``, in a process group of its own that holds what it starts (the
worker's executors, the driver's JVM): ``stop`` and the end of ``stream`` end the groups,
and so does the death of the test process, which runs no ``finally`` when it is killed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervised import supervised, supervised_argv

STOP_GRACE_S = 15.0
"""How long a daemon has to stop on SIGTERM before its group is SIGKILLed."""
WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")
ROOT = Path(__file__).resolve().parent.parent


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def loopback_hosts_usable() -> bool:
    """Whether this machine lets a process bind 127.0.0.2 and 127.0.0.3 (Linux does;
    macOS has 127.0.0.1 only unless aliases are added)."""
    for host in WORKER_HOSTS:
        try:
            with socket.socket() as s:
                s.bind((host, 0))
        except OSError:
            return False
    return True


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LoopbackCluster:
    """The master and the two workers (see the module docstring)."""

    def __init__(self, root: Path, *, worker_memory: str = "1g") -> None:
        self.root = root
        self.worker_memory = worker_memory
        self.port = _free_port("127.0.0.1")
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.start_seconds = 0.0
        """From starting the master to both workers registered with it."""

    def _env(self, host: str) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": host,
            "SPARK_DAEMON_MEMORY": "256m",
            "PYSPARK_PYTHON": sys.executable,
        }

    def _daemon(self, name: str, host: str, args: list[str]) -> Path:
        log = self.root / f"{name}.log"
        with log.open("wb") as out:
            self.procs.append(
                subprocess.Popen(
                    supervised_argv(
                        [str(spark_home() / "bin" / "spark-class"), *args], STOP_GRACE_S
                    ),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self._env(host),
                    cwd=self.root,
                    start_new_session=True,
                )
            )
        return log

    def _wait(self, log: Path, text: str, deadline: float) -> None:
        while text not in log.read_text(errors="replace"):
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a Spark daemon exited; {log}:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {text!r} in {log} in time:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def start(self, timeout_s: float = 180.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        master = self._daemon(
            "master",
            "127.0.0.1",
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(self.port), "--webui-port", "0"],
        )  # fmt: skip
        self._wait(master, "I have been elected leader", deadline)
        logs = []
        for host in WORKER_HOSTS:
            args = [
                "org.apache.spark.deploy.worker.Worker", "--host", host, "--cores", "1",
                "--memory", self.worker_memory, "--webui-port", "0",
                "--work-dir", str(self.root / f"work-{host}"), self.url,
            ]  # fmt: skip
            logs.append(self._daemon(f"worker-{host}", host, args))
        for log in logs:
            self._wait(log, "Successfully registered with master", deadline)
        self.start_seconds = time.monotonic() - t0

    def driver_env(self, **conf: str) -> dict[str, str]:
        """The environment of a driver process on this cluster: it binds to 127.0.0.1
        (the executors reach it there), its executors run this interpreter, and
        ``conf`` (Spark settings) goes to the JVM it starts."""
        settings = {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": "512m",
            "spark.ui.enabled": "false",
            # Spark's default of 200 shuffle partitions costs minutes on two cores (the audit)
            "spark.sql.shuffle.partitions": "4",
            **conf,
        }
        args = " ".join(f"--conf {k}={v}" for k, v in settings.items())
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYSPARK_SUBMIT_ARGS": f"{args} pyspark-shell",
        }

    def stream(
        self, run_dir: Path, *args: str, timeout_s: float = 900
    ) -> tuple[subprocess.CompletedProcess[str], float]:
        """``ckpt stream --run-dir RUN_DIR --master <this cluster> ARGS`` as a driver
        process of its own group (one that ``--die-at`` SIGKILLs leaves nothing behind
        here; its executors the master stops); its output, and how long it ran."""
        t0 = time.monotonic()
        with supervised(
            [sys.executable, "-m", "ckpt", "stream", "--run-dir", str(run_dir),
             "--master", self.url, *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**self.driver_env(), "COLUMNS": "200"},
        ) as proc:  # fmt: skip
            out, _ = proc.communicate(timeout=timeout_s)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
        return done, time.monotonic() - t0

    def stop(self) -> None:
        """Each supervisor SIGTERMs its daemon's group, SIGKILLs what is left of it after
        ``STOP_GRACE_S`` (an executor), and exits."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(STOP_GRACE_S + 10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="session")
def loopback_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackCluster]:
    """One loopback cluster per pytest worker, for the tests that need executors on two
    hosts (the worker that first runs one starts it)."""
    if not loopback_hosts_usable():
        pytest.skip(
            "cannot bind 127.0.0.2 and 127.0.0.3 here (a loopback with one address):"
            " the two-host Spark cluster of the failure tests cannot start"
        )
    cluster = LoopbackCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster.start()
        print(f"\nloopback Spark cluster up in {cluster.start_seconds:.1f} s at {cluster.url}")
        yield cluster
    finally:
        cluster.stop()
