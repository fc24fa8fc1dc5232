"""The link between a node's per-message ClientApp and its long-lived party worker.

A SuperNode runs every message in a fresh ``flwr-clientapp`` process. With a
party worker (:mod:`tpsl_flwr.simulations.party_worker`) that process only
forwards: it sends the message and the node's context over a Unix domain
socket to the worker, which keeps torch, the data and the party loaded and
runs the very same ClientApp on them, and it returns the worker's reply
content. Both halves of that exchange are here, side by side:
:func:`ask_worker` (the forwarding side; it imports no torch) and
:class:`WorkerServer` (the worker side; it serves any
``(Message, Context) -> Message`` callable).

Wire format, one request per connection: a request is two frames, Flower's
own protobuf encodings of the ``Message`` and of the ``Context`` (its state
left empty: the worker keeps the node's state); the answer is one frame,
``b"ok"`` + the reply's ``RecordDict`` protobuf, or ``b"er"`` + a UTF-8
reason. A frame is an 8-byte big-endian length and the bytes.

Access control: the socket sits in a folder that must be ``0700`` (owned by
the worker's user, no group or world bits; the worker refuses to start
otherwise), the socket file itself is ``0600``, and every connection's peer
uid (``SO_PEERCRED``) must be the worker's own uid, else it is closed
unanswered.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from collections.abc import Callable
from pathlib import Path

from flwr.app import Context, Message, RecordDict
from flwr.common import serde
from flwr.proto.message_pb2 import Context as ProtoContext  # pylint: disable=E0611
from flwr.proto.message_pb2 import Message as ProtoMessage  # pylint: disable=E0611
from flwr.proto.recorddict_pb2 import (  # pylint: disable=E0611
    RecordDict as ProtoRecordDict,
)

from tpsl_flwr.errors import ProtocolError

__all__ = [
    "WORKER_SOCKET",
    "WorkerError",
    "WorkerServer",
    "ask_worker",
    "check_private_folder",
    "peer_uid",
    "socket_path",
]

WORKER_SOCKET = "worker-socket"
"""Node-config key naming the party worker's socket; absent: no worker."""

_LEN = struct.Struct(">Q")
_OK, _ERR = b"ok", b"er"
_MAX_FRAME = 1 << 34


class WorkerError(ProtocolError):
    """The party worker refused, failed or could not be reached."""


def socket_path(socket_dir: str | Path, partition: int) -> Path:
    """The socket of partition ``partition``'s worker in ``socket_dir``."""
    return Path(socket_dir) / f"party-{partition}.sock"


def check_private_folder(folder: Path) -> None:
    """Raise ``WorkerError`` unless ``folder`` is a 0700 folder of this user.

    Examples
    --------
    >>> import tempfile
    >>> check_private_folder(Path(tempfile.mkdtemp()))  # mkdtemp makes 0700
    """
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise WorkerError(f"socket folder {folder} is not a folder")
    if info.st_uid != os.getuid():
        raise WorkerError(
            f"socket folder {folder} is owned by uid {info.st_uid}, not by this "
            f"user ({os.getuid()})"
        )
    if info.st_mode & 0o077:
        raise WorkerError(
            f"socket folder {folder} has mode {stat.S_IMODE(info.st_mode):04o}; "
            f"it must be reachable by its owner only: chmod 700 {folder}"
        )


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (Linux)."""
    creds = conn.getsockopt(
        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
    )
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _send(conn: socket.socket, *parts: bytes) -> None:
    size = sum(len(part) for part in parts)
    conn.sendall(_LEN.pack(size) + b"".join(parts))


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        n = conn.recv_into(view[got:], size - got)
        if n == 0:
            raise WorkerError("the party worker closed the connection")
        got += n
    return bytes(buffer)


def _recv(conn: socket.socket) -> bytes:
    (size,) = _LEN.unpack(_recv_exact(conn, _LEN.size))
    if size > _MAX_FRAME:
        raise WorkerError(f"frame of {size} bytes refused")
    return _recv_exact(conn, size)


def ask_worker(path: str | Path, message: Message, context: Context) -> RecordDict:
    """Have the worker at ``path`` handle ``message``; return the reply content.

    Parameters
    ----------
    path
        The worker's socket (node config ``worker-socket``).
    message
        The message as the SuperNode delivered it.
    context
        The node's context (run and node config; its state is not sent).

    Returns
    -------
    RecordDict
        The content of the worker's reply.

    Raises
    ------
    WorkerError
        If the worker cannot be reached, refuses, or its ClientApp raised
        (the worker's reason is in the message).
    """
    shared = Context(
        run_id=context.run_id,
        node_id=context.node_id,
        node_config=context.node_config,
        state=RecordDict(),
        run_config=context.run_config,
    )
    request_msg = serde.message_to_proto(message).SerializeToString()
    request_ctx = serde.context_to_proto(shared).SerializeToString()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(str(path))
        except OSError as err:
            raise WorkerError(
                f"cannot reach the party worker at {path} ({err}); start it on "
                "this machine with `tpsl-flwr party` (see README, Deploying "
                "across organisations)"
            ) from err
        try:
            _send(conn, _LEN.pack(len(request_msg)), request_msg, request_ctx)
            answer = _recv(conn)
        except OSError as err:  # e.g. reset: the worker refused this peer
            raise WorkerError(
                f"the party worker closed the connection ({err})"
            ) from err
    if answer[:2] == _OK:
        proto = ProtoRecordDict()
        proto.ParseFromString(answer[2:])
        return serde.recorddict_from_proto(proto)
    reason = answer[2:].decode("utf-8", errors="replace")
    raise WorkerError(f"party worker at {path}: {reason}")


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
    """

    def __init__(
        self, path: str | Path, handle: Handler, allowed_uid: int | None = None
    ) -> None:
        self.path = Path(path)
        self.handle = handle
        self.allowed_uid = os.getuid() if allowed_uid is None else allowed_uid
        self.refused = 0
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

    def serve_one(self) -> bool:
        """Accept one connection and answer it; ``False`` if refused."""
        conn, _ = self._sock.accept()
        with conn:
            uid = peer_uid(conn)
            if uid != self.allowed_uid:
                self.refused += 1
                return False
            try:
                raw = _recv(conn)
            except WorkerError:
                return False
            (msg_size,) = _LEN.unpack(raw[: _LEN.size])
            msg_proto, ctx_proto = ProtoMessage(), ProtoContext()
            msg_proto.ParseFromString(raw[_LEN.size : _LEN.size + msg_size])
            ctx_proto.ParseFromString(raw[_LEN.size + msg_size :])
            try:
                message = serde.message_from_proto(msg_proto)
                reply = self.handle(message, serde.context_from_proto(ctx_proto))
                if reply.has_error():
                    raise WorkerError(reply.error.reason)
                body = serde.recorddict_to_proto(reply.content).SerializeToString()
                answer = _OK + body
            except Exception as ex:  # pylint: disable=broad-exception-caught
                answer = _ERR + f"{type(ex).__name__}: {ex}".encode()
            try:
                _send(conn, answer)
            except OSError:
                return False
        return True

    def close(self) -> None:
        """Close the socket and remove its file."""
        self._sock.close()
        self.path.unlink(missing_ok=True)
