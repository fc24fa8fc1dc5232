import dataclasses
import shutil

from tools import reference_page as cli_reference
from tools.reference_page import (
    COMMAND,
    PROJECT_ROOT,
    REFERENCE,
    app_config,
    main,
    render,
)
from tpsl_flwr.cli.main import build_parser
from tpsl_flwr.experiments.config import LABEL_PARTY_ONLY, ExperimentConfig
from tpsl_flwr.experiments.config_fields import FIELD_HELP


def test_the_committed_reference_is_generated_from_this_code():
    committed = (PROJECT_ROOT / REFERENCE).read_text(encoding="utf-8")
    assert committed == render(), f"{REFERENCE} is out of date: run `{COMMAND}`"


def test_every_key_is_a_row_with_its_default_and_the_apps_value():
    page = render()
    app = app_config()
    for field in dataclasses.fields(ExperimentConfig):
        key = field.name.replace("_", "-")
        rows = [line for line in page.splitlines() if line.startswith(f"| `{key}` |")]
        assert len(rows) == 1, key
        cells = [c.strip() for c in rows[0].split(" | ")]
        assert cells[2] == cli_reference._code(field.default), key
        if field.name in LABEL_PARTY_ONLY:
            assert key not in app and cells[3] == "-", key
        else:
            assert cells[3] == cli_reference._code(app[key]), key
    # The app's own value where it differs from the dataclass's.
    assert "| `rows` | int | `0` | `100000` |" in page


def test_every_command_and_flag_is_documented():
    page = render()
    for name, _, sub in cli_reference._subcommands(build_parser()):
        assert f"| `tpsl-flwr {name}` |" in page
        for action in sub._actions:
            if "-h" in action.option_strings:
                continue
            for flag in action.option_strings:
                # Config flags are the run-config table's rows.
                key = flag.removeprefix("--no-").removeprefix("--")
                assert f"`{flag}`" in page or f"| `{key}` |" in page, (name, flag)


def test_check_fails_once_the_code_changes(tmp_path, monkeypatch, capsys):
    # Prepare: a project folder with its pyproject.toml and a fresh page.
    shutil.copy(PROJECT_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "docs").mkdir()
    assert main(["--root", str(tmp_path)]) == 0
    assert main(["--root", str(tmp_path), "--check"]) == 0

    # Execute: a field's help changes in the code, the page does not.
    monkeypatch.setitem(FIELD_HELP, "epochs", "training epochs, changed")
    status = main(["--root", str(tmp_path), "--check"])

    # Assert
    assert status == 1
    assert f"run `{COMMAND}`" in capsys.readouterr().err
    assert main(["--root", str(tmp_path)]) == 0
    assert "training epochs, changed" in (tmp_path / REFERENCE).read_text()
