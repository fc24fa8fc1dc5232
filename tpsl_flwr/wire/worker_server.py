"""The party worker's end of the worker link: one request at a time, in order.

:class:`WorkerServer` serves any ``(Message, Context) -> Message`` callable on
a 0600 Unix socket in a 0700 folder, to peers of its own uid only, in the wire
format of :mod:`tpsl_flwr.wire.worker_link` (whose :func:`ask_worker
<tpsl_flwr.wire.worker_link.ask_worker>` is the other end). Numbered messages
(several SuperNodes per party) run in the order sent
(:mod:`~tpsl_flwr.wire.worker_order`).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flwr.app import Context, Message
from flwr.common import serde

from tpsl_flwr.errors import ProtocolError
from tpsl_flwr.wire.worker_link import (
    _ERR,
    _IO_TIMEOUT,
    _OK,
    FrameError,
    WorkerError,
    _decode_request,
    _frame,
    _recv,
    check_private_folder,
    peer_uid,
)
from tpsl_flwr.wire.worker_order import HOLD_S, InOrder

__all__ = ["Handler", "WorkerServer"]

_LOG = logging.getLogger(__name__)

Handler = Callable[[Message, Context], Message]


class WorkerServer:
    """The worker's end: a 0600 Unix socket in a 0700 folder, one request a time.

    Parameters
    ----------
    path
        Socket file to create (its folder must already be 0700).
    handle
        ``(message, context) -> reply``; an exception becomes an error answer
        with the exception's type and text.
    allowed_uid
        The only peer uid served (default: this process's uid).
    sequence_of
        ``(message, context) -> (run id, number) | None``: a message with a
        number runs only after every lower number of its run
        (:class:`~tpsl_flwr.wire.worker_order.InOrder`; an early one waits,
        its connection open); ``None`` (default), or ``None`` returned: it
        runs as it arrives.
    hold_s
        Longest wait of an early message for its predecessors, in seconds;
        then the run ends at this worker (:class:`InOrder`).

    Attributes
    ----------
    refused
        Connections closed unanswered because of the peer's uid.
    dropped
        Connections whose request was malformed or whose socket failed.
    """

    def __init__(
        self,
        path: str | Path,
        handle: Handler,
        allowed_uid: int | None = None,
        sequence_of: Callable[[Message, Context], tuple[int, int] | None] | None = None,
        hold_s: float = HOLD_S,
    ) -> None:
        self.path = Path(path)
        self.handle = handle
        self.sequence_of = sequence_of
        self._order: InOrder[_Request] = InOrder(hold_s)
        self.allowed_uid = os.getuid() if allowed_uid is None else allowed_uid
        self.refused = 0
        self.dropped = 0
        check_private_folder(self.path.parent)
        if self.path.is_socket():
            self.path.unlink()  # a stale socket of an earlier worker
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self._sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self._sock.listen(8)

    @property
    def holding(self) -> bool:
        """Whether a numbered message is held for its predecessors."""
        return self._order.waiting

    def serve_one(self) -> bool:
        """Accept one connection and answer it; ``False`` if refused or dropped.

        Nothing a peer sends ends the worker: a malformed request or a
        socket error is logged in one line, answered with the reason when the
        peer still listens, and counted in :attr:`dropped`. A numbered
        message that came early is held (its connection stays open) and
        answered once its predecessors have run; while one is held, the wait
        for a connection lasts at most 1 s, so a message held too long is
        refused on time (``False`` then: a call that refuses held messages, or
        in which no connection came, returns before serving one).
        """
        expired = self._order.expire()
        for request, reason in expired:
            _refuse(request, reason)
        if expired:
            return False
        self._sock.settimeout(1.0 if self._order.waiting else None)
        try:
            conn, _ = self._sock.accept()
        except TimeoutError:
            return False
        held = False
        try:
            conn.settimeout(_IO_TIMEOUT)
            served = self._serve(conn)
            held = served is None
            return served is not False
        except (FrameError, OSError) as err:
            self.dropped += 1
            _LOG.warning("worker socket %s: request dropped: %s", self.path, err)
            _answer_quietly(conn, _ERR + f"bad request: {err}".encode())
            return False
        finally:
            if not held:
                conn.close()

    def _serve(self, conn: socket.socket) -> bool | None:
        """``True``: answered, ``False``: refused peer, ``None``: held for later."""
        uid = peer_uid(conn)
        if uid != self.allowed_uid:
            self.refused += 1
            _LOG.warning(
                "worker socket %s: refused a peer of uid %d (serving uid %d)",
                self.path,
                uid,
                self.allowed_uid,
            )
            return False
        message, context = _decode_request(_recv(conn))
        try:
            number = (
                None if self.sequence_of is None else self.sequence_of(message, context)
            )
        except ProtocolError as err:  # e.g. a number that is not a number
            conn.sendall(_frame(_ERR, f"{type(err).__name__}: {err}".encode()))
            return True
        if number is None:
            conn.sendall(self._answer(message, context))
            return True
        this = _Request(conn, message, context)
        ready, refused = self._order.arrive(*number, this)
        for request, reason in refused:
            _refuse(request, reason, close=request is not this)
        for request in ready:
            try:
                request.conn.sendall(self._answer(request.message, request.context))
            except OSError as err:  # that peer is gone; the step has run
                _LOG.warning("worker socket %s: answer lost: %s", self.path, err)
            finally:
                if request is not this:
                    request.conn.close()
        answered = [request for request, _ in refused] + ready
        return True if any(request is this for request in answered) else None

    def _answer(self, message: Message, context: Context) -> bytes:
        """The answer frame: the reply content, or the handler's error."""
        try:
            reply = self.handle(message, context)
            if reply.has_error():
                raise WorkerError(reply.error.reason)
            body = serde.recorddict_to_proto(reply.content).SerializeToString()
            return _frame(_OK, body)
        except Exception as ex:  # pylint: disable=broad-exception-caught
            return _frame(_ERR, f"{type(ex).__name__}: {ex}".encode())

    def close(self) -> None:
        """Close the socket (and any held connection) and remove its file."""
        for (_run, _number), (_since, request) in self._order.held.items():
            request.conn.close()
        self._sock.close()
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True, eq=False)
class _Request:
    """A decoded request and the connection its answer goes to."""

    conn: socket.socket
    message: Message
    context: Context


def _refuse(request: _Request, reason: str, close: bool = True) -> None:
    """Answer ``request`` with ``reason`` (logged) and, by default, close it."""
    _LOG.warning("worker refused a message: %s", reason)
    _answer_quietly(request.conn, _ERR + f"WorkerError: {reason}".encode())
    if close:
        request.conn.close()


def _answer_quietly(conn: socket.socket, answer: bytes) -> None:
    """Send an error answer if the peer still listens; ignore it if not."""
    try:
        conn.sendall(_frame(answer))
    except OSError:
        pass
