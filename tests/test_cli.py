"""The command line as a new user meets it: every mistake is one line on stderr
with exit status 2 (no traceback), ``--help`` shows defaults, every ``serve``
role takes every lease setting, files are checked before long runs."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leaseproto import LeaseConfig
from leaseproto.cli import build_parser, main
from leaseproto.cli._lease_flags import LEASE_KEYS, config_from_args

ROUTER = ["serve", "router", "--prefill", "tcp://127.0.0.1:1", "--decode", "tcp://127.0.0.1:2"]


def run_cli(
    *args: str, block: str | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``leaseproto ARGS`` in a fresh interpreter; ``block``: a module made unimportable
    there (as if its extra were not installed)."""
    pre = f"import sys; sys.modules[{block!r}] = None; " if block else "import sys; "
    code = pre + f"from leaseproto.cli import main; sys.exit(main({list(args)!r}))"
    return subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=timeout
    )


def assert_usage_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == ""
    assert "Traceback" not in r.stderr, r.stderr
    for needle in needles:
        assert needle in r.stderr, r.stderr


@pytest.fixture
def busy_port() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


# -- --help -----------------------------------------------------------------------------
def _parsers(p: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for child in dict.fromkeys(a.choices.values()):
                yield from _parsers(child)


def test_help_shows_every_default() -> None:
    """Every option with a default names it in --help (ours or argparse's own text)."""
    checked = 0
    for p in _parsers(build_parser()):
        text = " ".join(p.format_help().split())
        for a in p._actions:
            if not a.option_strings or a.nargs == 0 or a.default in (None, [], argparse.SUPPRESS):
                continue
            if isinstance(a.default, bool):
                continue
            help_text = " ".join((a.help or "").split())
            shown = f"(default: {a.default})"
            assert "default" in help_text or shown in text, (p.prog, a.option_strings)
            checked += 1
    assert checked > 30


def test_help_of_every_command_renders() -> None:
    for p in _parsers(build_parser()):
        assert p.format_help().startswith("usage: ")


# -- serve ------------------------------------------------------------------------------
def test_log_level_is_checked() -> None:
    r = run_cli(*ROUTER, "--log-level", "LOUD")
    assert_usage_error(r, "LOUD", "DEBUG, INFO, WARNING, ERROR")


def test_log_level_any_case() -> None:
    args = build_parser().parse_args([*ROUTER, "--log-level", "debug"])
    assert args.log_level == "DEBUG"


@pytest.mark.parametrize("flag", ["--prefill", "--decode"])
def test_address_without_scheme_is_refused_with_a_hint(flag: str) -> None:
    argv = [*ROUTER]
    argv[argv.index(flag) + 1] = "127.0.0.1:17001"
    r = run_cli(*argv)
    assert_usage_error(r, flag, "tcp://HOST:PORT", "did you mean tcp://127.0.0.1:17001")


def test_request_plane_port_in_use(busy_port: int) -> None:
    r = run_cli(*ROUTER, "--port", str(busy_port))
    assert_usage_error(r, f"127.0.0.1:{busy_port}", "in use", "--port 0")


def test_metrics_port_in_use(busy_port: int) -> None:
    r = run_cli(*ROUTER, "--metrics-port", str(busy_port))
    assert_usage_error(r, f"metrics on 127.0.0.1:{busy_port}", "in use", "-1 disables")


def test_serve_without_its_extra_names_the_extra() -> None:
    r = run_cli(*ROUTER, block="zmq")
    assert_usage_error(r, "'serve' extra", "pip install 'leaseproto[serve]'")


def test_unsafe_lease_setting_on_serve() -> None:
    r = run_cli(*ROUTER, "--kv-lease-duration", "30", "--heartbeat-interval", "25")
    assert_usage_error(r, "leaseproto serve router:", "heartbeat_interval")


@pytest.mark.parametrize("role", ["prefill", "decode", "router"])
def test_every_role_takes_every_lease_key_and_vllms_extra_config(role: str) -> None:
    parser = build_parser()
    tail = ROUTER[2:] if role == "router" else []
    cfg = LeaseConfig(
        60.0,
        decoder_kv_blocks_ttl=600.0,
        heartbeat_interval=5.0,
        lease_extension=30.0,
        max_lease_lifetime=900.0,
        safety_margin=4.0,
        tombstone_ttl=700.0,
        staging_ttl=50.0,
        max_notification_bytes=2048,
        tombstone_capacity=1000,
        staging_capacity=100,
    )
    flags = [a for k in LEASE_KEYS for a in ("--" + k.replace("_", "-"), str(getattr(cfg, k)))]
    args = parser.parse_args(["serve", role, *flags, *tail])
    assert config_from_args(args) == cfg
    # vLLM's dict: our keys and its own (ignored); a flag overrides its key
    extra = '{"kv_lease_duration": 60, "backends": ["UCX"], "heartbeat_interval": 7}'
    args = parser.parse_args(
        ["serve", role, "--kv-connector-extra-config", extra, "--heartbeat-interval", "6", *tail]
    )
    assert config_from_args(args) == LeaseConfig(60.0, heartbeat_interval=6.0)


def test_extra_config_not_json() -> None:
    r = run_cli(*ROUTER, "--kv-connector-extra-config", "{oops")
    assert_usage_error(r, "--kv-connector-extra-config is not valid JSON")


# -- sim --------------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--out", "--plot"])
def test_sim_checks_its_output_paths_before_the_run(
    flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    import leaseproto.sim

    def no_run(*a: object, **k: object) -> None:
        raise AssertionError("the simulation ran before the output path was checked")

    monkeypatch.setattr(leaseproto.sim, "compare", no_run)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / ("out" if flag == "--out" else "plot.png")
    assert main(["sim", flag, str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("leaseproto sim: ") and str(blocker) in err
    assert "not a folder" in err or "Not a directory" in err


def test_sim_plot_path_that_is_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert main(["sim", "--plot", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


# -- prove ------------------------------------------------------------------------------
def test_prove_only_unknown_id_goes_to_stderr() -> None:
    pytest.importorskip("z3")
    r = run_cli("prove", "--only", "I99")
    assert_usage_error(r, "no obligation matches --only I99")


def test_prove_without_z3_names_the_prove_extra() -> None:
    r = run_cli("prove", block="z3")
    assert_usage_error(r, "pip install 'leaseproto[prove]'")
    assert "leaseproto[test]" not in r.stderr


def test_prove_labels_each_obligation_once(every_obligation: list[Any]) -> None:
    labels = [(o.system, o.label) for o in every_obligation]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    assert not dupes, dupes[:5]


@pytest.mark.parametrize("only", ["L14", "I9", "I17", "I99"])  # none builds L15 or L16
def test_prove_only_builds_what_it_keeps(only: str, every_obligation: list[Any]) -> None:
    """``--only`` skips building the code runs whose obligations do not name it, and
    keeps exactly what it kept when everything was built."""
    from leaseproto.proofs import check

    def labels(obs: list[Any]) -> list[tuple[str, str]]:
        return [(o.system, o.label) for o in obs]

    assert labels(check.select(check.all_obligations(only=only), only)) == labels(
        check.select(every_obligation, only)
    )


# -- other commands ---------------------------------------------------------------------
def test_spec_diagrams_missing_file() -> None:
    r = run_cli("spec-diagrams", "--check", "/nonexistent/spec.md")
    assert_usage_error(r, "/nonexistent/spec.md")


def test_demo_checks_json_path_first(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = run_cli("demo", "--json", str(blocker / "x.json"))
    assert_usage_error(r, "leaseproto demo:", "not a folder")


def test_missing_extra_message_names_the_extra() -> None:
    from leaseproto.cli._errors import missing_extra

    exc = ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")
    assert "pip install 'leaseproto[plot]'" in missing_extra(exc)


# -- every flag checked up front (issue 21 §2) -------------------------------------------
def refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str, run: bool = True
) -> str:
    """``main(argv)`` refuses with status 2 and one clear message on stderr, in this
    process; argparse's usage error or the command's own line, no traceback.
    ``run=False``: only parse (a command line accepted by mistake must not run)."""
    status: object = "accepted"
    try:
        if run:
            status = main(argv)
        else:
            build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse's usage error
        status = exc.code
    out, err = capsys.readouterr()
    assert status == 2 and out == "", (status, out, err)
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture
def no_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything starts a process (the demo's workers would)."""

    def popen(*a: object, **k: object) -> None:
        raise AssertionError(f"a child process was started: {a}")

    monkeypatch.setattr(subprocess, "Popen", popen)


def test_unknown_option_without_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(capsys, ["--bogus"], "unrecognized arguments: --bogus", "config, replay")
    assert "arguments are required" not in err
    err = refused(capsys, ["serve", "--bogus"], "unrecognized arguments: --bogus", "prefill")
    assert "arguments are required" not in err


def test_no_command_names_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, [], "name a COMMAND: config, replay")
    refused(capsys, ["serve"], "name a ROLE: prefill, decode, router")


@pytest.mark.parametrize("role", ["prefill", "decode", "router"])
@pytest.mark.parametrize(
    ("flag", "value"),
    [("--port", "99999"), ("--port", "-5"), ("--metrics-port", "99999"), ("--port", "80.5")],
)
def test_serve_ports_out_of_range_are_refused(
    role: str, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # before the fix: --port 99999 bound 34463, -5 bound 65531, --metrics-port 99999
    # was an OverflowError traceback
    tail = ROUTER[2:] if role == "router" else []
    refused(
        capsys,
        ["serve", role, *tail, flag, value],
        f"leaseproto serve {role}: error: argument {flag}: expected a port 1..65535",
        repr(value),
        run=False,
    )


def test_serve_ports_in_range_are_taken() -> None:
    args = build_parser().parse_args([*ROUTER, "--port", "65535", "--metrics-port", "-1"])
    assert (args.port, args.metrics_port) == (65535, -1)
    args = build_parser().parse_args(["serve", "prefill", "--nixl-port", "0", "--port", "1"])
    assert (args.nixl_port, args.port) == (0, 1)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["serve", "decode", "--max-running", "0"], "--max-running: expected a whole number >= 1"),
        (["serve", "prefill", "--num-blocks", "-3"], "--num-blocks: expected a whole number"),
        (["serve", "prefill", "--tp", "two"], "--tp: expected a whole number >= 1, got 'two'"),
        (["serve", "decode", "--step-time", "-1"], "--step-time: expected a finite number >= 0"),
        ([*ROUTER, "--request-timeout", "nan"], "--request-timeout: expected a finite number > 0"),
        (["serve", "decode", "--device", "gpu"], "--device: expected cpu, cuda or cuda:N"),
        (["serve", "prefill", "--device", "cuda:"], "--device: expected cpu, cuda or cuda:N"),
        (["sim", "--jobs", "0"], "--jobs: expected a whole number >= 1"),
        (["sim", "--sample-dt", "0"], "--sample-dt: expected a finite number > 0"),
        (["sim", "--d-engines", "0"], "--d-engines: expected a whole number >= 1"),
        (["check", "--max-states", "-1"], "--max-states: expected a whole number >= 1"),
        (["prove", "--timeout-ms", "0"], "--timeout-ms: expected a whole number >= 1"),
    ],
)
def test_every_command_checks_its_numbers(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    refused(capsys, argv, needle, run=False)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        # before the fix: an IndexError after 24 s
        (["--first-wave", "-1"], "argument --first-wave: expected a whole number >= 1, got '-1'"),
        # before the fix: failed from a child after 15-18 s, status 1
        (["--max-running", "0"], "argument --max-running: expected a whole number >= 1"),
        (["--device", "gpu"], "argument --device: expected cpu, cuda or cuda:N"),
        (["--wave", "0"], "argument --wave: expected a whole number >= 1"),
        (["--waves", "-1"], "argument --waves: expected a whole number >= 0"),
        (["--max-tokens", "0"], "argument --max-tokens: expected a whole number >= 1"),
        (["--step-time", "inf"], "argument --step-time: expected a finite number >= 0"),
    ],
)
def test_demo_refuses_a_bad_flag_before_any_worker_starts(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str], no_child: None
) -> None:
    refused(capsys, ["demo", *argv], "leaseproto demo: error: " + needle)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        # before the fix: a ValueError traceback
        (["--kv-lease-duration", "0"], "--kv-lease-duration: kv_lease_duration=0.0 must be > 0"),
        (
            ["--kv-lease-duration", "nan"],
            "--kv-lease-duration: kv_lease_duration=nan must be finite",
        ),
        (
            ["--max-tokens", "1015"],
            "--max-tokens 1015: a 10-token prompt and 1015 new tokens exceed the model's 1024",
        ),
        # a device this machine does not have (format checked, then torch asked)
        (["--device", "cuda:99"], "--device cuda:99: "),
    ],
)
def test_demo_checks_what_its_workers_would_refuse_before_starting_them(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str], no_child: None
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("zmq")
    refused(capsys, ["demo", *argv], "leaseproto demo: " + needle)


def test_demo_device_cuda_without_cuda(capsys: pytest.CaptureFixture[str], no_child: None) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("zmq")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --device cuda is valid here")
    refused(capsys, ["demo", "--device", "cuda"], "--device cuda: torch sees no CUDA device")


def test_serve_checks_the_device_before_building_the_worker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("zmq")
    refused(
        capsys,
        ["serve", "prefill", "--device", "cuda:99"],
        "leaseproto serve prefill: --device cuda:99",
    )


def test_flag_types() -> None:
    from leaseproto.cli import _flag_types as ft

    assert ft.port("1") == 1 and ft.port("65535") == 65535
    assert ft.port_or_zero("0") == 0 and ft.metrics_port("-1") == -1
    assert ft.positive_float("0.5") == 0.5 and ft.non_negative_float("0") == 0.0
    assert ft.positive_int("3") == 3 and ft.non_negative_int("0") == 0
    assert [ft.device(d) for d in ("cpu", "cuda", "cuda:0", "cuda:12")]
    for check, text in [
        (ft.port, "0"),
        (ft.port, "65536"),
        (ft.port_or_zero, "-1"),
        (ft.metrics_port, "-2"),
        (ft.positive_float, "0"),
        (ft.positive_float, "-inf"),
        (ft.non_negative_float, "-0.1"),
        (ft.non_negative_float, "nan"),
        (ft.positive_int, "1.0"),
        (ft.non_negative_int, "-1"),
        (ft.device, "CUDA"),
        (ft.device, "cuda:-1"),
        (ft.device, "mps"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match="expected"):
            check(text)
