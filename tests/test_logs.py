"""One record, one line: values from requests or sysfs cannot forge log lines."""

from __future__ import annotations

import json
import logging

import pytest

from plugin.process.logs import JsonFormatter, TextFormatter

HOSTILE = "0\n2026-01-01 00:00:00 INFO forged\r\x1b[2J\x85\u2028end"


def record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("plugin.test", logging.WARNING, __file__, 1, message, args, None)


def test_text_format_escapes_control_characters_from_arguments() -> None:
    line = TextFormatter("%(levelname)s %(message)s").format(record("refused %s", HOSTILE))
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert "\x85" not in line and "\u2028" not in line
    assert line == ("WARNING refused 0\\n2026-01-01 00:00:00 INFO forged\\r\\x1b[2J\\x85"
                    "\\u2028end")


@pytest.mark.parametrize("message", [HOSTILE, "plain", "tab\there", "\x00\x7f"])
def test_json_format_is_one_line_that_decodes_to_the_message(message: str) -> None:
    line = JsonFormatter().format(record("%s", message))
    assert len(line.splitlines()) == 1
    assert not any(ch in line for ch in "\x1b\x85\x7f\u2028\u2029")
    assert json.loads(line)["message"] == message


def test_the_api_clients_per_request_lines_are_not_logged_at_info(capsys) -> None:
    from plugin.process.logs import configure

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure("info", "text")
        logging.getLogger("httpx2").info("HTTP Request: GET https://api/x 200 OK")
        logging.getLogger("plugin.test").info("kept")
        logging.getLogger("httpx2").warning("kept too")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    err = capsys.readouterr().err
    assert "HTTP Request" not in err and "kept" in err and "kept too" in err
