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
reason. A frame is an 8-byte big-endian length and the bytes; either side
refuses a length above :data:`MAX_FRAME_BYTES` before reading (or allocating)
any of it, and reads the bytes in chunks, so memory follows what actually
arrives. A malformed request (bad header, truncated, oversized, undecodable)
costs the worker one log line and, where the peer still listens, an error
answer; the worker then serves the next connection.

Access control: the socket sits in a folder that must be ``0700`` (owned by
the worker's user, no group or world bits; the worker refuses to start
otherwise), the socket file itself is ``0600``, and every connection's peer
uid (``SO_PEERCRED``) must be the worker's own uid, else it is closed
unanswered. The forwarding side checks the same in the other direction: the
process listening on the socket must run as its own uid, else it sends
nothing and raises :class:`WorkerError` naming both uids.
"""

from __future__ import annotations

import logging
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

from tpsl_flwr._util.private_files import keep_private
from tpsl_flwr.errors import ProtocolError

__all__ = [
    "MAX_FRAME_BYTES",
    "WORKER_SOCKET",
    "FrameError",
    "WorkerError",
    "WorkerServer",
    "ask_worker",
    "check_private_folder",
    "peer_uid",
    "socket_path",
]

WORKER_SOCKET = "worker-socket"
"""Node-config key naming the party worker's socket; absent: no worker."""

MAX_FRAME_BYTES = 1 << 30
"""Largest frame either side sends or reads: 1 GiB.

The largest legitimate frame is the answer to the test query, which carries
every test row's embedding (``rows x embedding-dim x 4`` bytes of float32,
plus under 1% of protobuf framing; measured: 66,333 bytes for 256 rows at
dimension 64). A training message is far smaller (``steps-per-message``
batches: ``batch x (8 + 4 embedding-dim)`` bytes each, 1.3 kB at batch 32,
dimension 8). The test split of the largest built-in data (synthetic CTR, 3M
rows, 20% test) is 19 MB at the default dimension 8; all 45.8M Criteo rows
would give 293 MB. 1 GiB leaves more than 3x over that and refuses garbage
lengths (text read as a length is above 2^56) outright.
"""
_LEN = struct.Struct(">Q")
_OK, _ERR = b"ok", b"er"
_CHUNK = 1 << 20
"""Bytes read per ``recv``: a claimed length allocates nothing until it arrives."""
_IO_TIMEOUT = 60.0
"""Seconds the worker waits on one socket operation of a connection."""
_LOG = logging.getLogger(__name__)


class WorkerError(ProtocolError):
    """The party worker refused, failed or could not be reached."""


class FrameError(WorkerError):
    """A frame is malformed: a bad header, truncated, oversized or undecodable."""


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


def _frame(*parts: bytes) -> bytes:
    """One frame of ``parts``; ``FrameError`` if above :data:`MAX_FRAME_BYTES`."""
    size = sum(len(part) for part in parts)
    if size > MAX_FRAME_BYTES:
        raise FrameError(
            f"frame of {size} bytes exceeds the worker link's limit of "
            f"{MAX_FRAME_BYTES} bytes (MAX_FRAME_BYTES)"
        )
    return _LEN.pack(size) + b"".join(parts)


def _recv_exact(conn: socket.socket, size: int, what: str) -> bytes:
    """Read ``size`` bytes into buffers that grow only as bytes arrive.

    Each new buffer holds ``max(_CHUNK, bytes so far)``, so a length claim
    costs at most ``_CHUNK`` before its data arrives, memory stays within
    ``2 x received + _CHUNK``, and there are ``O(log size)`` buffers.
    """
    chunks: list[bytearray] = []
    got = 0
    while got < size:
        chunk = bytearray(min(size - got, max(_CHUNK, got)))
        view, filled = memoryview(chunk), 0
        while filled < len(chunk):
            n = conn.recv_into(view[filled:])
            if n == 0:
                raise FrameError(
                    f"truncated {what}: the peer closed after {got + filled} of "
                    f"{size} bytes"
                )
            filled += n
        chunks.append(chunk)
        got += filled
    return b"".join(chunks)


def _recv(conn: socket.socket) -> bytes:
    """Read one frame, refusing an oversized length before reading any of it."""
    (size,) = _LEN.unpack(_recv_exact(conn, _LEN.size, "frame header"))
    if size > MAX_FRAME_BYTES:
        raise FrameError(
            f"frame of {size} bytes refused: the limit is {MAX_FRAME_BYTES} "
            "bytes (MAX_FRAME_BYTES)"
        )
    return _recv_exact(conn, size, "frame")


def _check_server_uid(conn: socket.socket, path: str | Path) -> None:
    """Raise ``WorkerError`` unless the socket's listener runs as this uid."""
    theirs, mine = peer_uid(conn), os.getuid()
    if theirs != mine:
        raise WorkerError(
            f"the process listening at {path} runs as uid {theirs}, not as this "
            f"user (uid {mine}); nothing was sent to it"
        )


def _decode_reply(answer: bytes, path: str | Path) -> RecordDict:
    """The reply content of an ``ok`` answer; ``WorkerError`` otherwise."""
    if answer[:2] != _OK:
        reason = answer[2:].decode("utf-8", errors="replace")
        raise WorkerError(f"party worker at {path}: {reason}")
    proto = ProtoRecordDict()
    try:
        proto.ParseFromString(answer[2:])
        return serde.recorddict_from_proto(proto)
    except Exception as err:  # pylint: disable=broad-exception-caught
        raise FrameError(
            f"party worker at {path} sent an undecodable reply "
            f"({type(err).__name__}: {err})"
        ) from err


def _decode_request(raw: bytes) -> tuple[Message, Context]:
    """Split and decode a request frame; ``FrameError`` names what is wrong."""
    if len(raw) < _LEN.size:
        raise FrameError(
            f"request of {len(raw)} bytes is shorter than its {_LEN.size}-byte "
            "message length"
        )
    (msg_size,) = _LEN.unpack_from(raw)
    end = _LEN.size + msg_size
    if end > len(raw):
        raise FrameError(
            f"request says its message has {msg_size} bytes; the frame holds "
            f"{len(raw) - _LEN.size}"
        )
    view = memoryview(raw)
    msg_proto, ctx_proto = ProtoMessage(), ProtoContext()
    try:
        msg_proto.ParseFromString(view[_LEN.size : end])
        ctx_proto.ParseFromString(view[end:])
        message = serde.message_from_proto(msg_proto)
        return message, serde.context_from_proto(ctx_proto)
    except Exception as err:  # pylint: disable=broad-exception-caught
        raise FrameError(f"undecodable request ({type(err).__name__}: {err})") from err


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
        If the worker cannot be reached, listens under another uid (checked
        with ``SO_PEERCRED`` before anything is sent), refuses, answers a
        malformed frame, or its ClientApp raised (the worker's reason is in
        the message). :class:`FrameError` if the request itself exceeds
        :data:`MAX_FRAME_BYTES`.
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
    request = _frame(_LEN.pack(len(request_msg)), request_msg, request_ctx)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(str(path))
        except OSError as err:
            raise WorkerError(
                f"cannot reach the party worker at {path} ({err}); start it on "
                "this machine with `tpsl-flwr party` (see docs/deployment.md, "
                "Deploying across organisations)"
            ) from err
        _check_server_uid(conn, path)
        try:
            conn.sendall(request)
            answer = _recv(conn)
        except (OSError, FrameError) as err:  # e.g. the worker refused this peer
            raise WorkerError(
                f"the party worker at {path} closed the connection ({err})"
            ) from err
    return _decode_reply(answer, path)


Handler = Callable[[Message, Context], Message]


class WorkerServer:
    """The worker's end: a 0600 Unix socket in a 0700 folder, one request a time.

    Parameters
    ----------
    path
        Socket file to create (its folder must already be 0700). A stale
        socket file there is replaced; one a process still accepts
        connections on is refused (``WorkerError``).
    handle
        ``(message, context) -> reply``; an exception becomes an error answer
        with the exception's type and text.
    allowed_uid
        The only peer uid served (default: this process's uid).

    Attributes
    ----------
    refused
        Connections closed unanswered because of the peer's uid.
    dropped
        Connections whose request was malformed or whose socket failed.
    """

    def __init__(
        self, path: str | Path, handle: Handler, allowed_uid: int | None = None
    ) -> None:
        self.path = Path(path)
        self.handle = handle
        self.allowed_uid = os.getuid() if allowed_uid is None else allowed_uid
        self.refused = 0
        self.dropped = 0
        check_private_folder(self.path.parent)
        if self.path.is_socket():
            _refuse_a_live_socket(self.path)
            self.path.unlink()  # a stale socket of an earlier worker
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self._sock.bind(str(self.path))
        finally:
            os.umask(old)
        keep_private(self.path)
        self._sock.listen(8)

    def serve_one(self) -> bool:
        """Accept one connection and answer it; ``False`` if refused or dropped.

        Nothing a peer sends ends the worker: a malformed request or a
        socket error is logged in one line, answered with the reason when the
        peer still listens, and counted in :attr:`dropped`.
        """
        conn, _ = self._sock.accept()
        with conn:
            conn.settimeout(_IO_TIMEOUT)
            try:
                return self._serve(conn)
            except (FrameError, OSError) as err:
                self.dropped += 1
                _LOG.warning("worker socket %s: request dropped: %s", self.path, err)
                _answer_quietly(conn, _ERR + f"bad request: {err}".encode())
                return False

    def _serve(self, conn: socket.socket) -> bool:
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
        conn.sendall(self._answer(message, context))
        return True

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
        """Close the socket and remove its file."""
        self._sock.close()
        self.path.unlink(missing_ok=True)


def _refuse_a_live_socket(path: Path) -> None:
    """Raise ``WorkerError`` if a process still accepts connections at ``path``.

    Taking over its socket would leave that worker running with no traffic
    and send its party's next messages to a worker without the party's state.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return  # nobody listens: a stale socket file
    raise WorkerError(
        f"a party worker is already serving {path}; stop it first, or give this "
        "one another --socket-dir"
    )


def _answer_quietly(conn: socket.socket, answer: bytes) -> None:
    """Send an error answer if the peer still listens; ignore it if not."""
    try:
        conn.sendall(_frame(answer))
    except OSError:
        pass
