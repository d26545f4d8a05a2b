"""``--dra-share``: the families DRA publishes for sharing, and every malformed value refused
at start in one line naming the family and why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from plugin.cli.config import parse
from plugin.cli.sources import describe
from plugin.serving.dra.share_setting import (
    FamilyShare,
    parse_shares,
    setting_of,
    sharing_on,
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELERATOR_DP_DRA_SHARE", raising=False)
    monkeypatch.delenv("ACCELERATOR_DP_CONFIG", raising=False)


def test_nothing_is_shared_by_default() -> None:
    settings = parse(["serve"])
    assert settings.dra_share == ()
    assert not sharing_on(settings.dra_share)
    assert setting_of(settings.dra_share, "intel") == 0


def test_image_a_number_and_off_per_family() -> None:
    settings = parse(["serve", "--dra-share", "intel=image, alveo=4"])
    assert settings.dra_share == (FamilyShare("intel", None), FamilyShare("alveo", 4))
    assert setting_of(settings.dra_share, "intel") is None
    assert setting_of(settings.dra_share, "alveo") == 4
    assert setting_of(settings.dra_share, "aws") == 0
    assert sharing_on(settings.dra_share)
    assert "dra-share=intel=image,alveo=4 [flag]" in describe(settings.origins)


@pytest.mark.parametrize("text", ["alveo=1", "intel=off", "intel=OFF,alveo=1", ""])
def test_one_context_or_off_shares_nothing(text: str) -> None:
    shares = parse_shares(text)
    assert not sharing_on(shares)
    assert setting_of(shares, "alveo") == 0 and setting_of(shares, "intel") == 0


def test_the_variable_and_the_file_take_the_same_values(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("dra-share: [intel=image, alveo=4]\n")
    assert parse(["serve", "--config", str(config)]).dra_share == (
        FamilyShare("intel", None), FamilyShare("alveo", 4))
    config.write_text("dra-share: alveo=2\n")
    assert parse(["serve", "--config", str(config)]).dra_share == (FamilyShare("alveo", 2),)
    monkeypatch.setenv("ACCELERATOR_DP_DRA_SHARE", "intel=3")
    assert parse(["serve", "--config", str(config)]).dra_share == (FamilyShare("intel", 3),)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("aws=2", "aws devices cannot be shared: only intel and alveo can"),
        ("units=image", "units devices cannot be shared"),
        ("intel=image,gpu=2", "'gpu' is not a device family this driver knows"),
        ("alveo=0", "alveo=0: the number of contexts must be between 1 and 4096"),
        ("alveo=-3", "alveo=-3: expected image, off or a number of contexts"),
        ("intel=many", "intel=many: expected image, off or a number of contexts"),
        ("intel=2.5", "intel=2.5: expected image"),
        ("intel=image,alveo=2,intel=3", "intel is given twice"),
        ("alveo", "'alveo' is not FAMILY=VALUE"),
        ("=4", "'=4' is not FAMILY=VALUE"),
        ("alveo=99999", "between 1 and 4096"),
    ],
)
def test_a_bad_value_exits_2_in_one_line_naming_the_family(value: str, words: str) -> None:
    for args, env in ((["serve", "--dra-share", value], {}),
                      (["serve"], {"ACCELERATOR_DP_DRA_SHARE": value})):
        result = subprocess.run([sys.executable, "-m", "plugin", *args], capture_output=True,
                                text=True, env={"PATH": "/usr/bin:/bin", **env}, timeout=60)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert words in lines[0]
