"""Start-up failures: one line that names the setting to change, and an exit code.

Whatever stops the server from starting (a port taken, an address that does not
resolve, a missing optional package, an unreadable file, Redis down) is raised
as a `StartupError`; `service.main.run_server` prints it as `error: <line>` and
exits with its code, with no traceback. The ports are checked before anything
starts (`check_address`), so a taken port never leaves a half-started server
(nor grpc-core's own log line) behind.
"""

from __future__ import annotations

import errno
import socket

from service.settings_errors import env_name

# Exit codes: 2 a setting is wrong (fix the configuration); 1 the environment
# refused (a port taken, Redis down), as before this module existed.
EXIT_CONFIG = 2
EXIT_ENVIRONMENT = 1


def setting_names(name: str) -> str:
    """`http_listen` → `--http-listen / FAIRGATE_HTTP_LISTEN`: where a user sets it."""
    return f"--{name.replace('_', '-')} / {env_name(name)}"


class StartupError(Exception):
    """The server cannot start because of `setting`; the message says what to do."""

    def __init__(self, setting: str, problem: str, exit_code: int = EXIT_CONFIG) -> None:
        self.setting = setting
        self.exit_code = exit_code
        super().__init__(f"{problem} (setting {setting}: {setting_names(setting)})")


_BIND_PROBLEMS = {
    errno.EADDRINUSE: "address already in use: stop what listens there or pick another port",
    errno.EADDRNOTAVAIL: "not an address of this machine",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
}


def check_address(setting: str, address: str, hint: str = "") -> None:
    """Resolve and bind `address` once, as the server will (SO_REUSEADDR, no
    SO_REUSEPORT), so a taken port or an unknown host is refused up front.
    Its shape (host:port) was checked with the settings (settings_rules)."""
    from service.settings_rules import host_port

    parsed = host_port(address)
    if parsed is None:
        raise StartupError(setting, f"{address!r} is not host:port (e.g. 127.0.0.1:8000)")
    host, port = parsed
    try:
        family, type_, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise StartupError(
            setting, f"cannot resolve {host!r} in {address!r}: {exc.strerror}"
        ) from None
    with socket.socket(family, type_, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            problem = _BIND_PROBLEMS.get(exc.errno or 0, exc.strerror or str(exc))
            raise StartupError(
                setting, f"cannot listen on {address}: {problem}{hint}", EXIT_ENVIRONMENT
            ) from None
