"""Config schema, TOML loader and the edge-agent CLI's config commands."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from agent import __version__
from agent.app import check_reload
from agent.cli import EX_CONFIG, main
from agent.config.loader import dump_config, dump_default_config, load_config, parse_config
from agent.config.schema import (
    AgentConfig,
    StreamConfig,
    default_config,
    resolve_model_path,
)
from agent.errors import ConfigError
from agent.sources.registry import REGISTRY
from agent.sources.replay import ReplayConfig
from agent.sources.serial import SerialConfig
from agent.sources.simulator import SimulatorConfig

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "systemd").glob("*.toml"))

MINIMAL = """
[[streams]]
name = "s1"
[streams.source]
kind = "simulator"
"""


def problems_of(text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={} if env is None else env)
    return info.value.problems


def write(tmp_path: Path, text: str, name: str = "agent.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- defaults and shipped files ------------------------------------------------------------


def test_minimal_config_takes_every_default() -> None:
    config = parse_config(MINIMAL, env={})
    assert config.agent.device_id == "edge-demo"
    assert config.agent.console_alerts is True
    assert config.agent.metrics_port is None
    assert config.mqtt.enabled is False
    stream = config.streams[0]
    assert isinstance(stream.source, SimulatorConfig)
    assert (stream.model, stream.window, stream.hop) == ("builtin:skab-wstat", None, None)
    assert stream.calibration_samples == 400
    assert (stream.rules.k, stream.rules.n, stream.rules.clear_ratio) == (7, 10, 0.9)
    assert config.store.path == "agent.db"


def test_default_config_is_one_simulator_stream_without_broker() -> None:
    config = default_config()
    assert [type(s.source) for s in config.streams] == [SimulatorConfig]
    assert config.mqtt.enabled is False
    assert config.agent.console_alerts is True


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_shipped_example_configs_validate(path: Path) -> None:
    env = {"MQTT_HOST": "broker.test"}
    config = load_config(path, env=env)
    assert config.streams


def test_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {"agent.example.toml", "skab-replay.toml"}


def test_skab_replay_points_at_the_dataset() -> None:
    path = REPO / "systemd" / "skab-replay.toml"
    config = load_config(path, env={}).resolved(path.parent)
    source = config.streams[0].source
    assert isinstance(source, ReplayConfig)
    assert source.path.endswith("shared/datasets/skab/valve1/0.csv")
    assert config.mqtt.enabled and config.mqtt.host == "127.0.0.1"


def test_every_field_has_a_description() -> None:
    def walk(model: type[BaseModel], seen: set[type[BaseModel]]) -> list[str]:
        if model in seen:
            return []
        seen.add(model)
        missing = [
            f"{model.__name__}.{n}" for n, f in model.model_fields.items() if not f.description
        ]
        for f in model.model_fields.values():
            for sub in _models_in(f.annotation):
                missing += walk(sub, seen)
        return missing

    assert walk(AgentConfig, set()) == []


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _models_in(a)]


# --- numbers and types ---------------------------------------------------------------------


def test_float_fields_accept_toml_integers() -> None:
    config = parse_config(
        MINIMAL + "speed = 1\nsample_rate_hz = 2\n[streams.rules]\ncooldown_s = 10\n", env={}
    )
    source = config.streams[0].source
    assert isinstance(source, SimulatorConfig)
    assert source.speed == 1.0 and isinstance(source.speed, float)
    assert config.streams[0].rules.cooldown_s == 10.0


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('[agent]\nmetrics_port = "9851"', "agent.metrics_port: Input should be a valid integer"),
        ("[agent]\nmetrics_port = true", "agent.metrics_port: Input should be a valid integer"),
        ("[mqtt]\nport = 1883.0", "mqtt.port: Input should be a valid integer"),
        ('[store]\naggregate_interval_s = "60"', "store.aggregate_interval_s: Input should be"),
        ("[mqtt]\nreconnect_min_s = true", "mqtt.reconnect_min_s: Input should be"),
        ("[agent]\nconsole_alerts = 1", "agent.console_alerts: Input should be a valid boolean"),
    ],
)
def test_wrong_types_are_rejected(toml: str, expected: str) -> None:
    problems = problems_of(MINIMAL + toml)
    assert len(problems) == 1
    assert problems[0].startswith(expected)


# --- problems with key paths ----------------------------------------------------------------


def test_unknown_key_reads_unknown_key() -> None:
    assert problems_of(MINIMAL + '[mqtt]\nhots = "x"') == [
        "mqtt.hots: unknown key (did you mean 'host'?)"
    ]
    assert problems_of(MINIMAL + "colour = 1") == ["streams[0].source.colour: unknown key"]


def test_bad_range_names_the_source_key_without_the_union_tag() -> None:
    text = """
[[streams]]
name = "s"
source = { kind = "serial", port = "/dev/ttyUSB0", baudrate = 0, channels = ["a"] }
"""
    assert problems_of(text) == ["streams[0].source.baudrate: Input should be greater than 0"]


def test_k_greater_than_n() -> None:
    (problem,) = problems_of(MINIMAL + "[streams.rules]\nk = 6\nn = 5")
    assert problem.startswith("streams[0].rules.k: k (6) must not exceed n (5)")


def test_hop_greater_than_window() -> None:
    (problem,) = problems_of(MINIMAL.replace('name = "s1"', 'name = "s1"\nwindow = 4\nhop = 5'))
    assert problem == "streams[0].hop: hop (5) must not exceed window (4)"


def test_duplicate_stream_names() -> None:
    assert problems_of(MINIMAL + MINIMAL) == ["streams[1].name: duplicate stream name 's1'"]


def test_missing_kind_and_unknown_kind() -> None:
    text = '[[streams]]\nname = "a"\nsource = {}\n[[streams]]\nname = "b"\nsource = {kind = "x"}'
    first, second = problems_of(text)
    assert first.startswith("streams[0].source: 'kind' is missing: one of 'camera', ")
    assert "'replay', 'serial', 'simulator'" in first
    assert second.startswith("streams[1].source: Input tag 'x'")


def test_no_streams() -> None:
    assert problems_of("[agent]\n")[0] == "streams: required key is missing"
    assert problems_of("streams = []")[0].startswith("streams: List should have at least 1")


def test_every_problem_is_listed_at_once() -> None:
    text = """
[agent]
device_id = "has space"
log_level = "info"

[[streams]]
name = "a"
source = { kind = "serial", port = "/dev/ttyUSB0", baudrate = 0, channels = ["x"] }
rules = { k = 11 }

[[streams]]
name = "a"
source = { kind = "replay" }

[mqtt]
hots = "broker"
port = 70000
"""
    problems = problems_of(text)
    keys = [p.split(": ", 1)[0] for p in problems]
    assert keys == [
        "agent.device_id",
        "agent.log_level",
        "streams[0].source.baudrate",
        "streams[0].rules.k",
        "streams[1].source.path",
        "streams[1].name",
        "mqtt.port",
        "mqtt.hots",
    ]


def test_bad_toml_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, '[agent]\ndevice_id = "x"\nlog_level = \n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    (problem,) = info.value.problems
    assert problem.startswith("TOML syntax error at line 3, column 13:")


@pytest.mark.parametrize("value", ["[" * 500 + "]" * 500, "{a=" * 500 + "1" + "}" * 500],
                         ids=["arrays", "inline-tables"])
def test_deeply_nested_toml_is_a_config_problem(tmp_path: Path, value: str) -> None:
    # tomllib recursed past the interpreter's limit: a RecursionError traceback (exit 1, which
    # systemd restarts in a loop), and on SIGHUP it ended the running agent
    path = write(tmp_path, f"{MINIMAL}\nx = {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    (problem,) = info.value.problems
    assert problem == "TOML nested too deeply (arrays or inline tables within each other)"
    assert check_reload(path) is None


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.toml")
    assert info.value.problems == ["cannot read file: No such file or directory"]


def test_section_level_value_error_has_no_pydantic_prefix() -> None:
    assert problems_of(MINIMAL + '[mqtt]\nca_file = "ca.pem"') == [
        "mqtt: ca_file is set but tls is false"
    ]


def test_schema_union_covers_every_registered_source_kind() -> None:
    union = StreamConfig.model_fields["source"].annotation
    assert set(get_args(union)) == {config for config, _ in REGISTRY.values()}


def test_invalid_builtin_model_name() -> None:
    (problem,) = problems_of(MINIMAL.replace('name = "s1"', 'name = "s1"\nmodel = "builtin:"'))
    assert problem.startswith("streams[0].model: invalid builtin model name")


# --- environment substitution --------------------------------------------------------------


def test_env_substitution() -> None:
    text = """
[agent]
device_id = "${DEVICE}"
state_dir = "${STATE:-/var/lib/x}"
[[streams]]
name = "s"
source = { kind = "simulator", channels = ["${CH}", "b"] }
[mqtt]
host = "${HOST:-fallback}"
topic_prefix = "$${literal}"
"""
    config = parse_config(text, env={"DEVICE": "gw-7", "CH": "temp", "HOST": ""})
    assert config.agent.device_id == "gw-7"
    assert config.agent.state_dir == "/var/lib/x"
    assert config.streams[0].source.channels == ["temp", "b"]
    assert config.mqtt.host == "fallback"  # empty counts as unset for :-
    assert config.mqtt.topic_prefix == "${literal}"


def test_missing_env_var_is_a_problem_at_its_key() -> None:
    text = MINIMAL + 'channels = ["a", "${NOPE}"]\n[agent]\ndevice_id = "${ALSO_NOPE}"\n'
    problems = problems_of(text)
    assert problems == [
        "streams[0].source.channels[1]: environment variable NOPE is not set "
        "(and no ${NOPE:-default})",
        "agent.device_id: environment variable ALSO_NOPE is not set (and no ${ALSO_NOPE:-default})",
    ]


def test_malformed_substitution() -> None:
    (problem,) = problems_of(MINIMAL + '[mqtt]\nhost = "${1bad}"')
    assert problem.startswith("mqtt.host: invalid substitution '${1bad}'")


# --- default config dump ---------------------------------------------------------------------


def test_default_config_dump_parses_back_to_the_default() -> None:
    text = dump_default_config()
    assert parse_config(text, env={}) == default_config()


def test_default_config_dump_comments_every_key() -> None:
    lines = dump_default_config().splitlines()
    for index, line in enumerate(lines):
        is_key = " = " in line and not line.startswith(("#", " "))
        if is_key or line.startswith("["):
            assert lines[index - 1].startswith("# "), line


def test_dump_round_trips_a_rich_config() -> None:
    config = AgentConfig(
        streams=[
            StreamConfig(
                name="a",
                source=SerialConfig(port="/dev/ttyUSB0", channels=["x", "y"]),
                window=32,
                hop=4,
                threshold_quantile=0.99,
            ),
            StreamConfig(
                name="b",
                source=SimulatorConfig.model_validate(
                    {
                        "faults": [
                            {"kind": "spike", "channel": "Current", "start_s": 5, "duration_s": 2}
                        ]
                    }
                ),
            ),
        ]
    )
    text = dump_config(config)
    tomllib.loads(text)
    assert parse_config(text, env={}) == config


# --- paths ------------------------------------------------------------------------------------


def test_resolved_makes_paths_absolute(tmp_path: Path) -> None:
    text = """
[agent]
state_dir = "state"
[[streams]]
name = "r"
model = "models/m"
source = { kind = "replay", path = "../data/x.csv" }
[mqtt]
tls = true
ca_file = "ca.pem"
"""
    config = parse_config(text, env={}).resolved(tmp_path / "etc")
    assert config.agent.state_dir == str(tmp_path / "etc" / "state")
    assert config.store.path == str(tmp_path / "etc" / "state" / "agent.db")
    assert config.streams[0].model == str(tmp_path / "etc" / "models" / "m")
    source = config.streams[0].source
    assert isinstance(source, ReplayConfig)
    assert source.path == str(tmp_path / "data" / "x.csv")
    assert config.mqtt.ca_file == str(tmp_path / "etc" / "ca.pem")
    assert config.mqtt.password_file is None


def test_resolve_model_path(tmp_path: Path) -> None:
    builtin = tmp_path / "models"
    assert resolve_model_path("builtin:skab-wstat", tmp_path, builtin) == builtin / "skab-wstat"
    assert resolve_model_path("pkg", tmp_path / "etc") == tmp_path / "etc" / "pkg"
    assert resolve_model_path("/abs/pkg", tmp_path) == Path("/abs/pkg")
    with pytest.raises(ValueError, match="invalid builtin model name"):
        resolve_model_path("builtin:../x", tmp_path)


# --- CLI ----------------------------------------------------------------------------------------


def test_cli_check_config_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(write(tmp_path, MINIMAL))]) == 0
    assert capsys.readouterr().out.startswith("OK: device 'edge-demo', 1 stream (s1: simulator")


def test_cli_check_config_names_the_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_FLEET_TOKEN", "t0k3n")
    text = MINIMAL + """
[fleet]
enabled = true
url = "http://fleet.example:8700"
token_env = "EDGE_FLEET_TOKEN"
"""
    assert main(["check-config", str(write(tmp_path, text))]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("fleet http://fleet.example:8700, model updates off"), out


def test_cli_check_config_broken(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, MINIMAL + MINIMAL + "[mqtt]\nhots = 1\n")
    assert main(["check-config", str(path)]) == EX_CONFIG == 78
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{path}: streams[1].name: duplicate stream name 's1'",
        f"{path}: mqtt.hots: unknown key (did you mean 'host'?)",
    ]


def test_cli_check_config_bad_toml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(write(tmp_path, "[agent"))]) == 78
    assert "TOML syntax error at line 1" in capsys.readouterr().err


def test_cli_run_with_broken_config_exits_78(tmp_path: Path) -> None:
    assert main(["run", "--config", str(write(tmp_path, "[agent]\n"))]) == 78


def test_cli_print_default_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["print-default-config"]) == 0
    assert parse_config(capsys.readouterr().out, env={}) == default_config()


def test_cli_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"edge-agent {__version__}\n"


def test_console_script_check_config_exit_78(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace('kind = "simulator"', 'kind = "simulator"\nspeed = -1'))
    beside_python = Path(sys.executable).with_name("edge-agent")
    script = str(beside_python) if beside_python.exists() else shutil.which("edge-agent")
    assert script, "the edge-agent console script is not installed (pip install -e .)"
    result = subprocess.run(
        [script, "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 78, result.stderr
    assert "streams[0].source.speed: Input should be greater than or equal to 0" in result.stderr


# --- [fleet] and [store] budget (fleet upload) ---------------------------------------------


def test_fleet_and_budget_defaults() -> None:
    config = parse_config(MINIMAL, env={})
    assert config.fleet.enabled is False
    assert (config.fleet.batch_records, config.fleet.max_bytes_per_s) == (500, None)
    assert config.store.budget_bytes == 512 * 1024 * 1024


def test_fleet_enabled_needs_url_and_exactly_one_token_source() -> None:
    base = MINIMAL + '\n[fleet]\nenabled = true\nurl = "https://fleet.test"\n'
    assert parse_config(base + 'token_env = "EDGE_FLEET_TOKEN"\n', env={}).fleet.enabled
    problems = problems_of(base)
    assert any(p.startswith("fleet") and "exactly one" in p for p in problems)
    problems = problems_of(base + 'token_env = "A"\ntoken_file = "t"\n')
    assert any("exactly one" in p for p in problems)
    problems = problems_of(MINIMAL + '\n[fleet]\nenabled = true\ntoken_env = "A"\n')
    assert any("url is required" in p for p in problems)


def test_fleet_batch_and_budget_ranges() -> None:
    problems = problems_of(MINIMAL + "\n[fleet]\nbatch_records = 5001\n")
    assert problems[0].startswith("fleet.batch_records")
    problems = problems_of(MINIMAL + "\n[store]\nbudget_bytes = 1000\n")
    assert problems[0].startswith("store.budget_bytes")


def test_fleet_token_file_is_resolved_relative_to_the_config(tmp_path: Path) -> None:
    text = MINIMAL + '\n[fleet]\nenabled = true\nurl = "http://f"\ntoken_file = "fleet.token"\n'
    config = parse_config(text, env={}).resolved(tmp_path)
    assert config.fleet.token_file == str(tmp_path / "fleet.token")


def test_resolved_makes_the_tls_and_secret_paths_absolute(tmp_path: Path) -> None:
    text = """
[[streams]]
name = "r"
source = { kind = "simulator" }
[mqtt]
tls = true
cert_file = "pki/gw1.pem"
key_file = "credentials/gw1.key"
key_password_file = "credentials/gw1.key.password"
[fleet]
enabled = true
url = "https://fleet.example:8443"
token_env = "TOK"
ca_file = "pki/fleet-ca.pem"
pinned_pubkey = "sha256//YhKJKSzoTt2b5FP18fvpHo7fJYqQCjAa3HWY3tvRMwE="
"""
    config = parse_config(text, env={}).resolved(tmp_path)
    assert config.mqtt.cert_file == str(tmp_path / "pki" / "gw1.pem")
    assert config.mqtt.key_file == str(tmp_path / "credentials" / "gw1.key")
    assert config.mqtt.key_password_file == str(tmp_path / "credentials" / "gw1.key.password")
    assert config.fleet.ca_file == str(tmp_path / "pki" / "fleet-ca.pem")


@pytest.mark.parametrize(("mqtt", "problem"), [
    ('cert_file = "c.pem"', "cert_file is set but tls is false"),
    ('tls = true\nkey_file = "k.pem"', "key_file is set but cert_file is not"),
])
def test_client_certificate_keys_need_tls_and_a_certificate(mqtt: str, problem: str) -> None:
    text = f'[[streams]]\nname = "r"\nsource = {{ kind = "simulator" }}\n[mqtt]\n{mqtt}\n'
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    assert any(problem in p for p in info.value.problems), info.value.problems
