"""Serial line settings: validated in the config, passed to pyserial as given."""

from __future__ import annotations

import pytest

from agent.config.loader import parse_config
from agent.errors import ConfigError
from agent.sources.serial import SerialConfig
from agent.sources.serial_line import line_settings

HEAD = '[[streams]]\nname = "s"\n[streams.source]\nkind = "serial"\nport = "/dev/ttyS0"\n' \
       'channels = ["a"]\n'


def test_full_line_settings_from_toml() -> None:
    config = parse_config(HEAD + 'bytesize = 7\nparity = "O"\nstopbits = 1.5\nrtscts = true\n'
                          'xonxoff = true\n[streams.source.rs485]\ndelay_before_tx_s = 0.002\n',
                          env={})
    source = config.streams[0].source
    assert isinstance(source, SerialConfig)
    assert line_settings(source) == {"baudrate": 115200, "timeout": 1.0, "bytesize": 7,
                                     "parity": "O", "stopbits": 1.5, "rtscts": True,
                                     "xonxoff": True}
    assert source.rs485 is not None and source.rs485.delay_before_tx_s == 0.002


@pytest.mark.parametrize(("line", "key"), [
    ("stopbits = 3", "streams[0].source.stopbits: Value error, stop bits must be 1, 1.5 or 2"),
    ("bytesize = 9", "streams[0].source.bytesize: Input should be 5, 6, 7 or 8"),
    ('parity = "X"', "streams[0].source.parity: Input should be 'N', 'E', 'O', 'M' or 'S'"),
])
def test_impossible_line_settings(line: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(HEAD + line + "\n", env={})
    assert info.value.problems[0].startswith(key.replace("Value error, ", ""))


def test_a_refused_line_setting_names_the_settings() -> None:
    # pyserial reports only the errno of tcsetattr (e.g. parity on a pseudo-terminal); the
    # message must say which line settings the port refused
    import termios  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from agent.sources.serial import SerialSource  # noqa: PLC0415

    def refuses(_port: str, **_settings: object) -> object:
        raise termios.error(22, "Invalid argument")

    cfg = SerialConfig(port="/dev/ttyS0", channels=["a"], baudrate=9600, bytesize=7, parity="E",
                       stopbits=2, rtscts=True)
    source = SerialSource(cfg, "s", serial_factory=refuses)  # type: ignore[arg-type]
    with pytest.raises(ConfigError,
                       match=r"settings rejected \(9600 7E2 rtscts\): .*Invalid argument"):
        source.run(lambda r: None, lambda e: None, threading.Event())
