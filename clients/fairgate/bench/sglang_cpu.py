"""The real SGLang server (CPU, tiny random Llama) started through the shared scripts,
and this fairgate run inside SGLang's venv (the in-process engine).

`../shared/sglang-cpu/` beside the checkout (or `FAIRGATE_SGLANG_CPU_DIR`) holds
`install.sh` (a cached venv under `~/.cache`) and `start.sh PORT [flags]`, which
prints `PID URL LOG` once `/health` answers. Used by tests/sglang (where every
failure is an error, never a skip: that suite runs only when asked for, `-m
sglang`) and by `fairgate bench gateway --sglang-cpu`.

SGLang's venv lacks most of fairgate's dependencies (grpcio, pydantic-settings,
redis, ...). `inproc_env()` runs fairgate there anyway: SGLang's venv Python, with
fairgate's venv appended to its path by a `sitecustomize` (SGLang's packages
first, fairgate's filling the gaps; both venvs must share one Python version).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from fairgate.bench.common import free_port

# The checkout this runs from (clients/fairgate/bench/ → the root), as an editable install.
REPO = Path(__file__).resolve().parents[3]
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


def model_dir() -> Path:
    return cache_home() / "tiny-llama"


# sglang.Engine keywords of start.sh's flags (the same engine as its server runs).
CPU_ENGINE_ARGS = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "disable_overlap_schedule": True,
    "max_total_tokens": 16384,
    "sleep_on_idle": True,
}


def inproc_env() -> dict[str, str]:
    """The environment that runs this fairgate under `venv_python()` (see the module doc)."""
    ours = sysconfig.get_paths()["purelib"]
    theirs = subprocess.run(
        [str(venv_python()), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    if theirs != str(sys.version_info[:2]):
        raise SglangUnavailable(
            f"SGLang's venv runs Python {theirs or '?'}, this one {sys.version_info[:2]}: "
            "fairgate's compiled dependencies cannot be shared"
        )
    overlay = (
        cache_home().parent
        / "fairgate-sglang-overlay"
        / hashlib.sha1(ours.encode()).hexdigest()[:12]
    )
    overlay.mkdir(parents=True, exist_ok=True)
    (overlay / "sitecustomize.py").write_text(
        "# fairgate's venv after SGLang's (written by fairgate.bench.sglang_cpu).\n"
        f"import site\nsite.addsitedir({ours!r})\n"
    )
    return {
        **os.environ,
        "SGLANG_USE_CPU_ENGINE": "1",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        # sgl_kernel's CPU stand-in, the overlay, then this checkout's packages.
        "PYTHONPATH": os.pathsep.join(
            [str(scripts_dir()), str(overlay), str(REPO / "clients"), str(REPO)]
        ),
    }


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
