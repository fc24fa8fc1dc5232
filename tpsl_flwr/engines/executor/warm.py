"""A warm ClientApp executor: one long-lived process serves a SuperNode's tasks.

A SuperNode started with ``--isolation process`` launches no ClientApp; an
executor polls its Runtime API (``AcquireTask``) and gets a token per task.
Flower's ``flower-superexec`` then starts ``flwr-clientapp --token ...`` for
each, which imports Flower and the app, pulls the task input, installs the
FAB, loads the ClientApp, calls it, pushes the reply and the context, and
exits (``flwr/supernode/runtime/run_clientapp.py``). :class:`WarmExecutor`
does the same steps per token, with Flower's own functions
(:mod:`~tpsl_flwr.engines.executor.flower_seam`), in ONE process that keeps
the loaded ClientApp across tasks:

- tasks are served one at a time, in the order the SuperNode hands them out;
- each task gets Flower's task heartbeat while it runs, and ends with a reply
  (or an error reply) and its final status (``COMPLETED``/``FAILED``) pushed
  as ``flwr-clientapp`` pushes them; an exception of the ClientApp becomes an
  error reply naming the node and its partition, and the executor serves the
  next task;
- a task's FAB is judged as soon as it is installed
  (:func:`~tpsl_flwr.engines.executor.fab_match.judge_fab`): an allow-listed
  ClientApp whose code is byte for byte the code imported here runs warm,
  anything else keeps running in stock ``flwr-clientapp`` processes (one log
  line says why). A FAB installed before the run (``flwr install``, or
  :func:`~tpsl_flwr.engines.executor.fab_match.install_bundle`, which the
  project's own deployments call) runs warm from its first task; otherwise
  that first task runs in a stock ``flwr-clientapp`` process, which installs
  it, and the FAB is judged after it. One FAB at most is
  loaded warm; another FAB's tasks run stock, never in the loaded app;
- a warm ClientApp is told that the same object serves every message
  (``protocol.APP_KEEPS_STATE`` in the context's state): the project's
  ClientApp then keeps the party in the app object and the context only its
  version (:mod:`~tpsl_flwr.wire.node_side`). The SuperNode keeps that
  context; an executor restarted mid-run has no party for it, so the run's
  next message is refused (the stock ``flwr-clientapp`` that serves it finds
  a version and no state) and the run stops, to be resumed from its
  checkpoints;
- a warm task that fails leaves the SuperNode's context as it was and marks
  its run failed here (so does a heartbeat or a final status the SuperNode
  refuses, HTTP 401 or 403, without Flower's ``SIGINT`` or its
  ``RunNotRunningException``): the run's later messages are refused, never
  run on a party the failure may have half-updated, and the next task comes;
- a task is bounded (the task bound: ``--task-timeout``, else the run
  config's ``reply-timeout``, else 600 s): a ClientApp still running then gets
  an error reply in its name, and the executor starts afresh in the same
  process (``exec``), since a Python thread cannot be stopped; a stock
  ``flwr-clientapp`` past the bound is killed.

It sees what ``flwr-clientapp`` sees (the task's message, context, run and
FAB, through the token), no more, from a Runtime API on loopback that its
own user listens on (:mod:`~tpsl_flwr.engines.executor.listener`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Error, Message
from flwr.clientapp import ClientApp

from tpsl_flwr._util.private_files import make_private_dir, write_private
from tpsl_flwr.engines.executor import flower_seam as F
from tpsl_flwr.engines.executor.fab_match import (
    WarmVerdict,
    find_installed,
    imported_root,
    judge_fab,
    judge_fab_bytes,
    package_digest,
)
from tpsl_flwr.engines.executor.listener import check_listener
from tpsl_flwr.engines.executor.settings import (
    DEFAULT_TASK_BOUND,
    EXIT_STUCK,
    FIRST_POLL,
    ExecutorSettings,
    error_reason,
    node_name,
    one_line,
    task_bound,
)
from tpsl_flwr.errors import PrivacyError, ProtocolError
from tpsl_flwr.wire import protocol as P

__all__ = [
    "DEFAULT_TASK_BOUND",
    "EXIT_STUCK",
    "ExecutorSettings",
    "WarmExecutor",
    "error_reason",
    "node_name",
    "restart",
    "task_bound",
]

_LOG = logging.getLogger("tpsl_flwr.executor")
_AUTH_METHODS = frozenset({"/flwr.proto.Runtime/AcquireTask"})
"""The Runtime API methods SuperExec authentication signs (as Flower's SuperExec)."""
_KEEP_FAILED = 64
"""Failed runs remembered (their later messages are refused)."""


@dataclass
class _Answer:
    """One task's answer: given once, by the ClientApp's return or the watchdog."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    given: bool = False

    def claim(self) -> bool:
        with self.lock:
            if self.given:
                return False
            self.given = True
            return True


class WarmExecutor:
    """Serves one SuperNode's ClientApp tasks in this process (see the module).

    Parameters
    ----------
    settings
        Address, allow-list, poll interval, task bound, secret.
    """

    def __init__(self, settings: ExecutorSettings) -> None:
        self.settings = settings
        self.verdicts: dict[str, WarmVerdict] = {}
        self.warm_hash: str | None = None
        self.app: ClientApp | None = None
        self.failed_runs: OrderedDict[int, str] = OrderedDict()
        self.served = 0
        self._failure = ""
        """The last way polling failed, logged once until it changes or a task comes."""
        self._confirmed: set[str] = set()  # FABs whose own bytes were judged
        # the code this process loads warm, as it is at start (after preload)
        self.imported: dict[str, dict[str, str]] = {}
        for ref in settings.warm_apps:
            try:
                self.imported[ref] = package_digest(ref.partition(":")[0])
            except ImportError:  # judged cold, naming the import, when it comes
                pass
        self._token_dir = make_private_dir(
            Path(tempfile.mkdtemp(prefix="tpsl-executor-")), check=False
        )
        interceptors: list[Any] = [
            F.RuntimeVersionHttpInterceptor(component_name="SuperExec")
        ]
        if settings.auth_secret:
            interceptors.append(
                F.SuperExecAuthHttpInterceptor(
                    master_secret=settings.auth_secret,
                    protected_methods=_AUTH_METHODS,
                )
            )
        self._acquirer = F.RuntimeHttpClient.from_server_address(
            server_address=settings.runtime_api_address,
            insecure=True,
            root_certificates=None,
            interceptors=interceptors,
            retry_invoker=F.unsignalled_retry_invoker(),
        )

    # ------------------------------------------------------------ the loop
    def run_forever(self, stop: threading.Event | None = None) -> None:
        """Acquire and serve tasks until ``stop`` is set (or forever)."""
        wait = FIRST_POLL
        while stop is None or not stop.is_set():
            if self.serve_next():
                wait = FIRST_POLL
                continue
            time.sleep(wait)
            wait = min(2 * wait, self.settings.poll_interval)

    def serve_next(self) -> bool:
        """Acquire one task and serve it; whether there was one.

        Raises
        ------
        PrivacyError
            If another user's socket listens on the Runtime API port: nothing
            is sent to it, and the executor stops.
        """
        if not self._supernode_listens():
            return False
        try:
            res = self._acquirer.AcquireTask(
                F.AcquireTaskRequest(supported_task_types=[F.TaskType.CLIENT_APP])
            )
        except Exception as error:  # the SuperNode restarting: poll on
            status = getattr(getattr(error, "response", None), "status_code", 0)
            if status == 401:
                raise PrivacyError(
                    f"the Runtime API at {self.settings.runtime_api_address} refused "
                    "the executor's SuperExec signature (HTTP 401): its secret is not "
                    "the one given to this SuperNode"
                ) from error
            answer = "does not answer"
            if status:
                answer = f"refuses AcquireTask (HTTP {status})"
            if self._failure != answer:
                _LOG.warning(
                    "executor: the SuperNode's Runtime API at %s %s (%s); polling on",
                    self.settings.runtime_api_address,
                    answer,
                    error,
                )
            self._failure = answer
            return False
        self._failure = ""
        if not (res.HasField("task") and res.token):
            return False
        task = res.task
        acquired = time.time()
        self._supernode_listens()  # the server that handed it out is still ours
        if task.fab_hash not in self.verdicts:
            self.judge(task.fab_hash)  # installed before the run: warm at once
        if self.warm_for(task.fab_hash):
            self._serve_warm(res.token, task, acquired)
        else:
            self._serve_stock(res.token, task)
        self.served += 1
        return True

    def _supernode_listens(self) -> bool:
        port = int(self.settings.runtime_api_address.rpartition(":")[2])
        if check_listener(port, self.settings.supernode_uid):
            return True
        if self._failure != "not listening":
            _LOG.warning(
                "executor: nothing listens on %s yet; polling on",
                self.settings.runtime_api_address,
            )
        self._failure = "not listening"
        return False

    def close(self) -> None:
        """Close the Runtime API client and remove the token folder."""
        self._acquirer.close()
        for path in self._token_dir.glob("*"):
            path.unlink(missing_ok=True)
        self._token_dir.rmdir()

    # ------------------------------------------------------------- routing
    def warm_for(self, fab_hash: str) -> bool:
        """Whether a task of the FAB ``fab_hash`` runs warm here."""
        verdict = self.verdicts.get(fab_hash)
        if verdict is None or not verdict.warm:
            return False
        if self.warm_hash is None:
            self.warm_hash = fab_hash
        return self.warm_hash == fab_hash

    def judge(self, fab_hash: str) -> WarmVerdict:
        """Judge the installed FAB ``fab_hash`` once; log the verdict in one line."""
        if fab_hash in self.verdicts:
            return self.verdicts[fab_hash]
        folder = find_installed(fab_hash)
        if folder is None:
            return WarmVerdict(None, "not installed yet")  # judged after a task
        verdict = judge_fab(folder, self.settings.warm_apps, self.imported)
        if verdict.warm and self.warm_hash not in (None, fab_hash):
            verdict = WarmVerdict(
                verdict.app_ref,
                f"FAB {self.warm_hash[:8]} is loaded warm already; another FAB "
                "never shares its process",
            )
        self.verdicts[fab_hash] = verdict
        if verdict.warm:
            _LOG.info("executor: FAB %s (%s) runs warm", fab_hash[:8], verdict.app_ref)
        else:
            _LOG.warning(
                "executor: FAB %s runs in flwr-clientapp processes: %s",
                fab_hash[:8],
                verdict.reason,
            )
        return verdict

    def _confirm_bytes(self, fab: Any) -> None:
        """Confirm, once per FAB, that the bundle's own bytes run warm.

        The verdict came from the installed folder, found by 8 hex digits of
        the hash; a bundle (Flower's ``Fab``) whose bytes do not hash to its
        ``hash_str`` or whose
        code is not the imported code is refused (this task gets an error
        reply) and runs stock from then on.
        """
        fab_hash = str(fab.hash_str)
        if fab_hash in self._confirmed:
            return
        actual = hashlib.sha256(fab.content).hexdigest()
        verdict = judge_fab_bytes(fab.content, self.settings.warm_apps, self.imported)
        if actual != fab_hash:
            verdict = WarmVerdict(None, f"its bytes hash to {actual[:8]}, not its id")
        if not verdict.warm:
            self.verdicts[fab_hash] = verdict
            if self.app is None:
                self.warm_hash = None  # nothing loaded: another FAB may be warm
            raise ProtocolError(
                f"FAB {fab_hash[:8]} was judged warm from its installed folder, "
                f"but its own bytes do not run warm: {verdict.reason}"
            )
        self._confirmed.add(fab_hash)

    def _load(self, ref: str) -> ClientApp:
        if self.app is None:
            app = F.load_app(ref, F.LoadClientAppError, imported_root(ref))
            if not isinstance(app, ClientApp):
                raise F.LoadClientAppError(f"{ref} is not a ClientApp")
            self.app = app
        return self.app

    # ---------------------------------------------------------- stock path
    def _serve_stock(self, token: str, task: Any) -> None:
        """Run the task in a stock ``flwr-clientapp`` process; wait for it."""
        token_file = write_private(
            self._token_dir / f"task-{task.task_id}", token.encode("ascii")
        )
        cmd = [
            self.settings.clientapp_command,
            "--runtime-api-address",
            self.settings.runtime_api_address,
            "--token-file",
            str(token_file),
            "--insecure",
            "--parent-pid",
            str(os.getpid()),
        ]
        # a fresh process alone takes seconds: never bounded below the default
        bound = max(self.settings.task_timeout or 0.0, DEFAULT_TASK_BOUND)
        started = time.time()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        try:
            proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            _LOG.error(
                "executor: task %d (run %d) ran past the task bound of %g s in "
                "flwr-clientapp; killed",
                task.task_id,
                task.run_id,
                bound,
            )
            self._finish(token, None, F.SubStatus.FAILED, "task bound exceeded")
        finally:
            token_file.unlink(missing_ok=True)
        _LOG.info(
            "executor task %d run %d stock exit %s in %.2f s",
            task.task_id,
            task.run_id,
            proc.returncode,
            time.time() - started,
        )
        self.judge(task.fab_hash)

    def _finish(self, token: str, context: Any, sub_status: str, details: str) -> None:
        client = self._task_client(token)
        try:
            F.push_task_output(client, context, sub_status, details)
        finally:
            client.close()

    def _task_client(self, token: str) -> Any:
        return F.RuntimeHttpClient.from_server_address(
            server_address=self.settings.runtime_api_address,
            insecure=True,
            root_certificates=None,
            interceptors=[
                F.RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                F.RuntimeTokenHttpInterceptor(token),
            ],
            retry_invoker=F.unsignalled_retry_invoker(),
        )

    # ----------------------------------------------------------- warm path
    def _serve_warm(self, token: str, task: Any, acquired: float) -> None:
        """``run_clientapp``'s steps for one token, in this process."""
        client = self._task_client(token)
        beat = F.task_heartbeat_fn(client, lambda w: self._mark_failed(task.run_id, w))
        heartbeat = F.HeartbeatSender(beat)  # rejected: the run's next are refused
        heartbeat.start()
        answer = _Answer()
        message: Message | None = None
        context: Context | None = None
        before: Any = None
        reply: Message | None = None
        sub_status, details = F.SubStatus.FAILED, "ClientApp task failed"
        watchdog: threading.Timer | None = None
        called = answered = pulled = 0.0
        steps: list[float] = []
        try:
            message, context, run, fab = F.pull_input(client, steps)
            pulled = time.time()
            before = F.context_to_proto(context)
            if fab.hash_str != self.warm_hash or run.fab_hash != self.warm_hash:
                raise ProtocolError(
                    f"task {task.task_id} brought FAB {fab.hash_str[:8]}, not the "
                    f"FAB {str(self.warm_hash)[:8]} loaded warm"
                )
            self._confirm_bytes(fab)
            refused = self.failed_runs.get(context.run_id)
            if refused is not None:
                raise ProtocolError(
                    f"an earlier message of run {context.run_id} failed here "
                    f"({refused}); resume the run (resume = true)"
                )
            app = self._load(self.verdicts[fab.hash_str].app_ref or "")
            context.state[P.APP_KEEPS_STATE] = ConfigRecord({"same-object": True})
            bound = task_bound(self.settings, dict(context.run_config))
            watchdog = threading.Timer(
                bound, self._stuck, (answer, client, message, before, bound)
            )
            watchdog.daemon = True
            watchdog.start()
            called = time.time()
            reply = app(message=message, context=context)
            answered = time.time()
            sub_status, details = F.SubStatus.COMPLETED, ""
        except Exception as error:  # a ClientApp's error is a reply, as Flower's
            code = F.ErrorCode.CLIENT_APP_RAISED_EXCEPTION
            if isinstance(error, F.LoadClientAppError):
                code = F.ErrorCode.LOAD_CLIENT_APP_EXCEPTION
            reason = error_reason(error, context)
            _LOG.error(
                "executor: %s, task %d: %s",
                node_name(context),
                task.task_id,
                reason,
                exc_info=not isinstance(error, ProtocolError),
            )
            sub_status, details = F.SubStatus.FAILED, reason
            if context is not None:
                self._mark_failed(context.run_id, reason)
            if before is not None:
                context = F.context_from_proto(before)  # the state as it was
            if message is not None:
                reply = Message(Error(code=code, reason=reason), reply_to=message)
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if answer.claim():
                try:
                    if reply is not None and context is not None:
                        F.push_message(client, reply, context)
                except Exception:  # pylint: disable=broad-except
                    _LOG.exception("executor: failed to push the reply")
                    sub_status, details = F.SubStatus.FAILED, "reply push failed"
                try:  # 403/401: the run or the task is over; the next task comes
                    F.push_status(client, context, sub_status, details)
                except Exception as error:  # pylint: disable=broad-except
                    why = f"status push failed: {one_line(error)}"
                    _LOG.error(
                        "executor: task %d (run %d): %s; the run's later messages "
                        "are refused",
                        task.task_id,
                        task.run_id,
                        why,
                    )
                    self._mark_failed(task.run_id, why)
            heartbeat.stop()
            client.close()
        if message is not None:
            _LOG.info(
                "executor %s %s acquired %.4f pulled %.4f called %.4f answered %.4f "
                "pushed %.4f (input %.4f head %.4f)",
                (context.node_config.get(P.PARTITION_ID, "-") if context else "-"),
                message.metadata.message_type,
                acquired,
                pulled,
                called,
                answered,
                time.time(),
                *[*steps, 0.0, 0.0][:2],
            )

    def _mark_failed(self, run_id: int, reason: str) -> None:
        self.failed_runs[run_id] = reason
        while len(self.failed_runs) > _KEEP_FAILED:
            self.failed_runs.popitem(last=False)

    def _stuck(
        self,
        answer: _Answer,
        client: Any,
        message: Message,
        before: Any,
        bound: float,
    ) -> None:
        """The watchdog: answer a task past its bound, then start afresh."""
        if not answer.claim():
            return
        context = F.context_from_proto(before)
        error = ProtocolError(
            f"the ClientApp did not return within {bound:g} s (the executor's task "
            "bound); the executor restarts, so resume the run (resume = true)"
        )
        reason = error_reason(error, context)
        _LOG.error("executor: %s: %s", node_name(context), reason)
        try:
            reply = Message(
                Error(code=F.ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason),
                reply_to=message,
            )
            F.push_message(client, reply, context)
            F.push_task_output(client, context, F.SubStatus.FAILED, reason)
        finally:
            restart(self.settings.restart_argv)


def restart(argv: Sequence[str] | None, exit_: Callable[[int], Any] = os._exit) -> None:
    """Replace this process with ``argv`` (same PID), or exit :data:`EXIT_STUCK`."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    if argv:
        os.execv(argv[0], list(argv))
    exit_(EXIT_STUCK)
