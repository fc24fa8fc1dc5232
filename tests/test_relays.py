"""Several SuperNodes per party: grouping, numbering, routing and in-order running."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict

from tpsl_flwr.engines.virtual_nodes import task_identity
from tpsl_flwr.errors import ConfigError, ProtocolError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_experiment
from tpsl_flwr.simulations.party_worker import PartyWorker
from tpsl_flwr.strategies.exchange import exchange
from tpsl_flwr.strategies.relays import Relays, check_relay_grid, group_relays
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.worker_link import WorkerError, ask_worker, socket_path
from tpsl_flwr.wire.worker_order import InOrder
from tpsl_flwr.wire.worker_server import WorkerServer

# Two parties, two SuperNodes each: node ids as Flower lists them
PARTY_0, PARTY_1 = [101, 303], [202, 404]
ORDER = [101, 202, 303, 404]


def _message(dst: int, content: RecordDict, kind: str = "train") -> Message:
    with task_identity(1, 0, 1):
        message = Message(content, dst_node_id=dst, message_type=kind)
    message.metadata.__dict__["_message_id"] = f"m{dst}-{id(message)}"
    return message


def _hello_reply(node: int, partition: int, worker: str | None) -> Message:
    info = {P.PARTITION_ID: partition, P.EMBEDDING_DIM: 4, P.NUM_TRAIN: 9}
    if worker is not None:
        info[P.WORKER_ID] = worker
    with task_identity(1, 0, 1):
        return Message(
            RecordDict({P.NODE: ConfigRecord(info)}),
            reply_to=_message(node, RecordDict(), P.MSG_HELLO),
        )


def _hellos(workers: dict[int, str | None]) -> list[Message]:
    return [_hello_reply(n, 0 if n in PARTY_0 else 1, workers[n]) for n in ORDER]


def test_each_partys_supernodes_are_grouped_behind_its_first_one():
    # Arrange: both SuperNodes of a party report the party's one worker
    workers = {101: "w0", 303: "w0", 202: "w1", 404: "w1"}

    # Act
    firsts, ids, relays = group_relays(_hellos(workers), ORDER, per_party=2)

    # Assert: one hello reply per party (for describe_nodes), in Flower's order
    assert ids == [101, 202]
    assert [r.metadata.src_node_id for r in firsts] == [101, 202]
    assert relays.groups == {101: PARTY_0, 202: PARTY_1}


@pytest.mark.parametrize(
    ("workers", "per_party", "match"),
    [
        ({101: "w0", 303: "w0", 202: "w1", 404: "w1"}, 3, "has 2 SuperNode"),
        ({101: "w0", 303: None, 202: "w1", 404: "w1"}, 2, "has no party worker"),
        ({101: "w0", 303: "w9", 202: "w1", 404: "w1"}, 2, "do not describe one"),
    ],
)
def test_a_party_with_other_supernodes_or_workers_is_refused(workers, per_party, match):
    # Act / Assert: before any training step, naming the partition
    with pytest.raises(ProtocolError, match=match):
        group_relays(_hellos(workers), ORDER, per_party)


def test_messages_are_numbered_per_party_and_sent_to_its_supernodes_in_turn():
    # Arrange: three rounds of one message per party, each to the first node
    relays = Relays({101: PARTY_0, 202: PARTY_1})
    rounds = [
        [
            _message(n, RecordDict({P.CONFIG: ConfigRecord({P.EPOCH: 0})}))
            for n in (101, 202)
        ]
        for _ in range(3)
    ]

    # Act
    for messages in rounds:
        relays.route(messages)

    # Assert: alternating SuperNodes, numbers 0, 1, 2 per party, allowed out
    got = [
        [(m.metadata.dst_node_id, m.content[P.CONFIG][P.SEQUENCE]) for m in ms]
        for ms in rounds
    ]
    assert got == [[(101, 0), (202, 0)], [(303, 1), (404, 1)], [(101, 2), (202, 2)]]
    for messages in rounds:
        for message in messages:
            P.check_outgoing(message.content)
    with pytest.raises(ProtocolError, match="no party's first SuperNode is node 303"):
        relays.route([_message(303, RecordDict())])


class _EchoGrid:
    """Pushes are answered at once by the node addressed (or by an error)."""

    def __init__(self, failing: int | None = None) -> None:
        self.delivered: list[int] = []
        self.failing = failing
        self.replies: dict[str, Message] = {}

    def push_messages(self, messages: list[Message]) -> list[str]:
        for message in messages:
            node = message.metadata.dst_node_id
            self.delivered.append(node)
            with task_identity(1, node, 1):
                body = (
                    Error(7, "node failed") if node == self.failing else message.content
                )
                self.replies[message.metadata.message_id] = Message(
                    body, reply_to=message
                )
        return [m.metadata.message_id for m in messages]

    def pull_messages(self, ids: set[str]) -> list[Message]:
        return [self.replies[i] for i in ids]


def test_replies_from_a_relay_come_back_in_the_first_supernodes_name():
    # Arrange: the second round goes to 303 and 404; 404 fails
    grid = _EchoGrid(failing=404)
    relays = Relays({101: PARTY_0, 202: PARTY_1})

    # Act
    replies = []
    for _ in range(2):
        messages = [
            _message(n, RecordDict({P.CONFIG: ConfigRecord({P.EPOCH: 0})}))
            for n in (101, 202)
        ]
        replies.append(exchange(grid, messages, timeout=5, relays=relays))  # type: ignore[arg-type]

    # Assert: delivered to the relays; the label party sees one node per party
    assert grid.delivered == [101, 202, 303, 404]
    second = {r.metadata.src_node_id: r for r in replies[1]}
    assert set(second) == {101, 202}
    assert second[101].content[P.CONFIG][P.SEQUENCE] == 1
    assert second[202].has_error() and second[202].error.reason == "node failed"


def test_several_supernodes_per_party_are_refused_outside_a_deployment(tmp_path):
    # Act / Assert: the strategy's check, and the run's before anything starts
    check_relay_grid(object(), 1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="supernodes-per-party = 2 is for Flower"):
        check_relay_grid(object(), 2)  # type: ignore[arg-type]
    cfg = ExperimentConfig(
        dataset="breast-cancer", supernodes_per_party=2, out_dir=str(tmp_path)
    )
    with pytest.raises(ConfigError, match="needs Flower's deployment runtime"):
        run_experiment(cfg, "local")
    with pytest.raises(ConfigError, match="without party workers"):
        run_experiment(cfg, "deployment", party_workers=False)
    with pytest.raises(ConfigError, match="supernodes-per-party must be"):
        ExperimentConfig(dataset="breast-cancer", supernodes_per_party=0)


# ------------------------------------------------------------ the worker side
@pytest.fixture
def private_dir():
    folder = Path(tempfile.mkdtemp(prefix="tpsl-test-"))  # a short socket path
    yield folder
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()


def _numbered(number: int, run: int = 5) -> Message:
    config = ConfigRecord({P.SEQUENCE: number, P.EPOCH: number})
    with task_identity(run, 11, 1):
        return Message(
            RecordDict({P.CONFIG: config}), dst_node_id=11, message_type="train"
        )


def _ask(path: Path, number: int, answers: dict[int, object], run: int = 5) -> None:
    context = Context(run, 11, {}, RecordDict(), {})
    try:
        answers[number] = ask_worker(path, _numbered(number, run), context)
    except WorkerError as err:
        answers[number] = err


def _start(path: Path, number: int, answers: dict[int, object], run: int = 5):
    thread = threading.Thread(target=_ask, args=(path, number, answers, run))
    thread.start()
    time.sleep(0.2)  # arrives before the next one
    return thread


def test_the_worker_runs_numbered_messages_in_the_order_sent(private_dir):
    # Arrange: a handler that notes the order it runs messages in
    ran: list[int] = []

    def handle(message: Message, context: Context) -> Message:
        ran.append(int(message.content[P.CONFIG][P.SEQUENCE]))
        return Message(message.content, reply_to=message)

    path = socket_path(private_dir, 0)
    server = WorkerServer(path, handle, sequence_of=PartyWorker.sequence_of)
    serving = threading.Thread(
        target=lambda: [server.serve_one() for _ in range(4)], daemon=True
    )
    serving.start()
    answers: dict[int, object] = {}

    # Act: messages 2 and 1 arrive before 0, then 3
    threads = [_start(path, n, answers) for n in (2, 1, 0, 3)]
    for thread in threads:
        thread.join(timeout=30)
    serving.join(timeout=30)
    server.close()

    # Assert: run 0, 1, 2, 3; each sender got its own message's reply
    assert ran == [0, 1, 2, 3]
    for number in range(4):
        reply = answers[number]
        assert isinstance(reply, RecordDict), reply
        assert reply[P.CONFIG][P.EPOCH] == number


def test_a_repeated_number_ends_the_run_at_the_worker(private_dir):
    # Arrange
    ran: list[int] = []

    def handle(message: Message, context: Context) -> Message:
        ran.append(int(message.content[P.CONFIG][P.SEQUENCE]))
        return Message(message.content, reply_to=message)

    path = socket_path(private_dir, 0)
    server = WorkerServer(path, handle, sequence_of=PartyWorker.sequence_of)
    serving = threading.Thread(
        target=lambda: [server.serve_one() for _ in range(5)], daemon=True
    )
    serving.start()
    answers: dict[int, object] = {}
    again: dict[int, object] = {}

    # Act: 0, then 2 (held), then 0 again, then 1; another run is unaffected
    for number in (0, 2):
        _start(path, number, answers).join(timeout=0.1)
    _start(path, 0, again).join(timeout=30)
    _start(path, 1, answers).join(timeout=30)
    _start(path, 0, answers, run=6).join(timeout=30)
    serving.join(timeout=30)
    server.close()

    # Assert: the repeat, the held 2 and the late 1 are refused; run 6 runs
    assert ran == [0, 0]
    assert "came again" in str(again[0])
    for number in (1, 2):
        assert isinstance(answers[number], WorkerError), answers[number]
        assert "the run ends at this worker" in str(answers[number])


def test_a_message_held_too_long_is_refused_with_the_reason(private_dir):
    # Arrange: message 0 never comes (a SuperNode forwarding elsewhere)
    path = socket_path(private_dir, 0)
    server = WorkerServer(
        path, lambda m, c: m, sequence_of=PartyWorker.sequence_of, hold_s=0.5
    )
    answers: dict[int, object] = {}
    asking = _start(path, 1, answers)

    # Act: take it, then serve until it is refused (each wait at most 1 s)
    server.serve_one()
    held = server.holding
    started = time.monotonic()
    while server.holding and time.monotonic() - started < 10:
        server.serve_one()
    asking.join(timeout=5)
    server.close()

    # Assert
    assert held and not server.holding
    assert isinstance(answers[1], WorkerError), answers[1]
    assert "waited 0.5 s for message 0, which never came" in str(answers[1])


def test_in_order_expires_only_runs_held_too_long():
    # Arrange
    order: InOrder[str] = InOrder(hold_s=10)
    order.arrive(1, 1, "a1")
    order.arrive(2, 3, "b3")
    order.held[(1, 1)] = (0.0, "a1")  # held since long ago

    # Act
    refused = order.expire(now=20.0)

    # Assert: run 1 ends (its later messages too); run 2 still waits
    assert [item for item, _ in refused] == ["a1"]
    assert order.arrive(1, 0, "a0")[1][0][0] == "a0"
    assert order.waiting and (2, 3) in order.held
