"""The Flower internals the warm executor is built on are where it expects them."""

from __future__ import annotations

import pytest

from tpsl_flwr.engines.executor import flower_seam


def test_every_flower_symbol_the_executor_uses_is_where_it_expects() -> None:
    # Execute
    gone = flower_seam.missing()

    # Assert: a Flower that moved one fails here, naming module.symbol
    assert gone == [], f"the installed Flower moved: {', '.join(gone)}"


def test_the_functions_it_calls_by_position_keep_their_parameters() -> None:
    # Execute
    changed = flower_seam.moved_signatures()

    # Assert
    assert changed == [], "; ".join(changed)


def test_a_moved_symbol_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a symbol Flower does not have, and a module it does not have
    seam = {
        **flower_seam.SEAM,
        "pull_task_input_v2": "flwr.supernode.runtime.run_clientapp",
        "RuntimeHttpClient": "flwr.supercore.no_such_module",
    }
    monkeypatch.setattr(flower_seam, "SEAM", seam)

    # Execute
    gone = flower_seam.missing()

    # Assert
    assert gone == [
        "flwr.supercore.no_such_module.RuntimeHttpClient",
        "flwr.supernode.runtime.run_clientapp.pull_task_input_v2",
    ]


def test_a_changed_signature_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: what the executor would expect of a changed push_message
    signatures = {**flower_seam.SIGNATURES, "push_message": ("client", "message")}
    monkeypatch.setattr(flower_seam, "SIGNATURES", signatures)

    # Execute
    changed = flower_seam.moved_signatures()

    # Assert
    assert changed == [
        "flwr.supernode.runtime.run_clientapp.push_message('client', 'message') is "
        "now push_message('client', 'message', 'context')"
    ]


def test_the_executor_reads_the_pull_backoff_it_shortens_from_flower() -> None:
    # The warm executor's pull retries after 5 ms where Flower waits 1 s; if
    # Flower drops the wait, the executor's own pull is no longer needed.
    from flwr.supercore import constant

    assert constant.PULL_INITIAL_BACKOFF == 1
