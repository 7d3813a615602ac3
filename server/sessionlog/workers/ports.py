"""One server per port, even when several processes share it.

Workers bind their port with SO_REUSEPORT so the kernel can spread connections over them; but
SO_REUSEPORT would also let a second server (of the same user) bind the same port and take half
the connections, silently. So the supervisor first binds the address *without* SO_REUSEPORT, as
a single server does: that fails when anyone listens there. Then it holds the port with a bound
socket that has SO_REUSEPORT and never listens (it receives no connections): the workers join
it, a restarted worker finds the port still its server's, and another server's own check fails.
The addresses of one server (gRPC, web console, metrics) are checked together, each probe kept
open until the last is done, so two of them on one port are refused as in a single process.
Port 0 is replaced by the port the kernel picks, so that every worker binds the same one.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

from sessionlog.startup import CannotStart


class PortInUse(CannotStart):
    """The address is in use or not this host's; the message names it and what to do."""


@dataclass
class Reservation:
    """An address held for the workers (see the module docstring)."""

    address: str
    """HOST:PORT with the port the workers bind (never 0)."""
    port: int
    sockets: list[socket.socket] = field(default_factory=list)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()


def split(address: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT) as (host, port); ValueError when it is not one."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]"), int(port_text)


def reserve(addresses: Sequence[tuple[str, str]]) -> list[Reservation]:
    """Check that nobody listens on any of ``addresses`` ((HOST:PORT, flag) pairs) and that
    one process could listen on them all at once (two of them on one port could not), then
    hold them, in order; PortInUse names the first that cannot be had."""
    planned: list[tuple[Reservation, list[tuple[socket.AddressFamily, str]]]] = []
    probes: list[socket.socket] = []
    try:
        # The probes stay open until every address is checked: a second one on a port the
        # first took is refused by the kernel, as it would be in a single server. (A held
        # socket does not listen, so it could not refuse it.)
        for address, flag in addresses:
            host, port, targets = _resolve(address, flag)
            reservation = Reservation(address, port)
            for family, ip in targets:
                probe = _probe(family, ip, reservation.port, address, flag)
                probes.append(probe)
                reservation.port = probe.getsockname()[1]
            shown = f"[{host}]" if ":" in host else host
            reservation.address = f"{shown}:{reservation.port}"
            planned.append((reservation, targets))
    finally:
        for probe in probes:
            probe.close()
    try:
        for reservation, targets in planned:
            for family, ip in targets:
                try:
                    reservation.sockets.append(_hold(family, ip, reservation.port))
                except OSError as exc:  # taken in the moment since the probe
                    raise PortInUse(
                        f"cannot listen on {reservation.address}: {_reason(exc)}: another "
                        "server there? pick another address"
                    ) from None
    except BaseException:
        for reservation, _ in planned:
            reservation.close()
        raise
    return [reservation for reservation, _ in planned]


def _resolve(address: str, flag: str) -> tuple[str, int, list[tuple[socket.AddressFamily, str]]]:
    """The host, the port and the (family, IP) pairs a server listening on ``address`` binds."""
    try:
        host, port = split(address)
        infos = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE | socket.AI_NUMERICSERV
        )
    except (OSError, ValueError) as exc:
        raise PortInUse(f"cannot listen on {address} ({flag}): {_reason(exc)}") from None
    targets: list[tuple[socket.AddressFamily, str]] = []
    for found, _, _, _, sockaddr in infos:
        family = socket.AddressFamily(found)
        target = (family, str(sockaddr[0]))
        if family in (socket.AF_INET, socket.AF_INET6) and target not in targets:
            targets.append(target)
    return host, port, targets


def _probe(
    family: socket.AddressFamily, ip: str, port: int, address: str, flag: str
) -> socket.socket:
    """A socket bound and listening without SO_REUSEPORT, as a lone server's would be."""
    try:
        return socket.create_server(
            (ip, port), family=family, dualstack_ipv6=family == socket.AF_INET6 and ip == "::"
        )
    except OSError as exc:
        raise PortInUse(
            f"cannot listen on {address} ({flag}): {_reason(exc)}: another server there? "
            "pick another address"
        ) from None


def _hold(family: socket.AddressFamily, ip: str, port: int) -> socket.socket:
    """A socket on the port that never listens: SO_REUSEPORT, so the workers can join it, and
    no SO_REUSEADDR, so another server's probe (SO_REUSEADDR) is refused even while none of
    this server's workers listens (all of them restarting): with it, the probe would pass, as
    nothing listens there, and that server's workers would then share the port with these.
    A connection in TIME_WAIT that a server without SO_REUSEPORT accepted (one with
    ``--workers 1``, stopped a moment ago) refuses such a bind; the hold then takes
    SO_REUSEADDR, as the probe did, and the port is guarded only while a worker listens."""
    try:
        return _bound(family, ip, port, reuse_address=False)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
    return _bound(family, ip, port, reuse_address=True)


def _bound(family: socket.AddressFamily, ip: str, port: int, reuse_address: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if ip == "::" else 1)
        sock.bind((ip, port))
    except OSError:
        sock.close()
        raise
    return sock


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)
    return str(exc)
