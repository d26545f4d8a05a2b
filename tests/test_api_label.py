"""The Node label accelerator.b-com.com/api read as --api auto reads it."""

from __future__ import annotations

import logging

import pytest

from plugin.process.api_label import LABEL, NO_LABEL, LabelReader, Override


@pytest.mark.parametrize(("labels", "override", "said"), [
    (None, Override.AUTO, f"no label {LABEL}"),
    ({}, Override.AUTO, f"no label {LABEL}"),
    ({"other": "dra"}, Override.AUTO, f"no label {LABEL}"),
    ({LABEL: "auto"}, Override.AUTO, f"label {LABEL}=auto"),
    ({LABEL: "device-plugin"}, Override.DEVICE_PLUGIN, f"label {LABEL}=device-plugin"),
    ({LABEL: "dra"}, Override.DRA, f"label {LABEL}=dra"),
])
def test_accepted_values(labels, override, said):
    pin = LabelReader("node-a").pin(labels)
    assert (pin.override, pin.said) == (override, said)


def test_a_bad_value_is_said_once_per_value_and_read_as_no_label(caplog):
    reader = LabelReader("node-a")
    with caplog.at_level(logging.WARNING):
        for value in ("DRA", "DRA", "both", "", "DRA"):
            assert reader.pin({LABEL: value}) is NO_LABEL
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"node node-a: label {LABEL}={v} is not one of auto, device-plugin, dra; ignored "
        "(the node is decided as without the label)" for v in ("DRA", "both", "")]
