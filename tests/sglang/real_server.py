"""The real SGLang server (CPU, tiny random Llama) started through the shared scripts.

`../shared/sglang-cpu/` (or `FAIRGATE_SGLANG_CPU_DIR`) holds `install.sh`
(a cached venv under `~/.cache`) and `start.sh PORT [flags]`, which prints
`PID URL LOG` once `/health` answers. Every failure here is an error, never a
skip: this suite only runs when it is asked for (`-m sglang`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fairgate.bench.common import free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 420.0


class SglangUnavailable(RuntimeError):
    """The real server could not be installed or started."""


def scripts_dir() -> Path:
    configured = os.environ.get("FAIRGATE_SGLANG_CPU_DIR")
    here = Path(configured) if configured else REPO.parent / "shared" / "sglang-cpu"
    if not (here / "start.sh").is_file():
        raise SglangUnavailable(
            f"no SGLang CPU scripts at {here} (set FAIRGATE_SGLANG_CPU_DIR to the folder "
            "holding install.sh and start.sh)"
        )
    return here


def cache_home() -> Path:
    default = Path.home() / ".cache" / "fairgate-sglang-cpu"
    return Path(os.environ.get("SGLANG_CPU_HOME", default))


def tokenizer_file() -> Path:
    return cache_home() / "tiny-llama" / "tokenizer.json"


def venv_python() -> Path:
    return cache_home() / "venv" / "bin" / "python"


def install() -> None:
    """Run install.sh (a no-op when the cache is current)."""
    proc = subprocess.run(
        [str(scripts_dir() / "install.sh")], capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        raise SglangUnavailable(f"sglang-cpu install.sh failed:\n{proc.stderr[-3000:]}")


# SGLang traces only with the OpenTelemetry SDK and OTLP exporters, which the CPU
# install leaves out: installed beside it (pinned to its opentelemetry-api) and
# put on the server's PYTHONPATH for the tracing tests.
OTEL_PACKAGES = (
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-grpc==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
)


def otel_overlay() -> Path:
    """The OpenTelemetry SDK for SGLang's venv, in a cached folder of its own."""
    target = Path.home() / ".cache" / "fairgate-sglang-otel" / "1.45.2"
    if (target / ".done").is_file():
        return target
    pip = cache_home() / "venv" / "bin" / "pip"
    staging = target.with_name(target.name + ".tmp")
    proc = subprocess.run(
        [str(pip), "install", "--quiet", "--target", str(staging), *OTEL_PACKAGES],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise SglangUnavailable(f"installing the OpenTelemetry SDK failed:\n{proc.stderr[-3000:]}")
    if target.exists():
        subprocess.run(["rm", "-rf", str(target)], check=True)
    staging.rename(target)
    (target / ".done").write_text("ok")
    return target


@dataclass(slots=True)
class RealSglang:
    """One running `sglang.launch_server` (a process group led by `pid`)."""

    pid: int
    url: str
    log: Path
    flags: tuple[str, ...]

    @classmethod
    def start(cls, *flags: str, env: dict[str, str] | None = None) -> RealSglang:
        port = free_port()
        env = {**os.environ, "START_TIMEOUT_S": str(int(START_TIMEOUT_S)), **(env or {})}
        proc = subprocess.run(
            [str(scripts_dir() / "start.sh"), str(port), *flags],
            capture_output=True,
            text=True,
            env=env,
            timeout=START_TIMEOUT_S + 60,
        )
        if proc.returncode != 0:
            raise SglangUnavailable(
                f"sglang start.sh {port} {' '.join(flags)} failed:\n{proc.stderr[-3000:]}"
            )
        pid, url, log = proc.stdout.split()[-3:]
        return cls(int(pid), url, Path(log), flags)

    @property
    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (SGLang takes its children along), SIGKILL to the group if it lingers."""
        if self.pid <= 0:  # a server this session did not start
            return
        self._signal(signal.SIGTERM, group=False)
        deadline = time.monotonic() + timeout_s
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if self._group_alive():
            self._signal(signal.SIGKILL, group=True)

    def kill(self) -> None:
        """Die like a crashed worker: SIGKILL to every process of the server at once."""
        assert self.pid > 0, "only a server this session started can be killed"
        self._signal(signal.SIGKILL, group=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _signal(self, sig: signal.Signals, *, group: bool) -> None:
        try:
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        return True
