"""The stand-ins for aws-fpga's ``fpga-load-local-image`` and ``fpga-describe-local-image``.

Written and started by :func:`compat_tests.fake_fpga_tools.write_stand_in_tools`, which
documents what each stand-in takes and refuses (from aws/aws-fpga's
``fpga_local_cmd_parse.c`` and ``fpga_local_cmd.c``); kept apart from the Intel and Alveo
stand-ins because the SDK's slots, state file and output format are its own.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from compat_tests.fake_tool_support import SBDF, pause, strtoul

AWS_VENDOR = "0x1d0f"
AWS_MANAGEMENT = {"0x1041": "f1", "0x9248": "f2"}
FPGA_SLOT_MAX = 8
AGFI = re.compile(r"^agfi-[0-9a-f]{17}$")
SHELL_VERSION = 0x04261818  # any value: the SDK prints the shell's

# AWS FPGA SDK --------------------------------------------------------------------------------

_AWS_USAGE_ERROR = 256 - 22  # parse_args returns -EINVAL; main returns it as the status


def _aws_args(argv: list[str], with_value: dict[str, str],
              flags: dict[str, str]) -> dict[str, str] | None:
    """getopt_long the SDK's way; None (after its usage and error lines) if refused."""
    parsed: dict[str, str] = {}
    words = iter(argv)
    for word in words:
        name, eq, inline = word.partition("=")
        if name in with_value:
            value = inline if eq else next(words, None)
            if value is None:
                break
            parsed[with_value[name]] = value
        elif len(word) > 2 and word[:2] in with_value and not word.startswith("--"):
            parsed[with_value[word[:2]]] = word[2:]
        elif word in flags:
            parsed[flags[word]] = "1"
        else:
            break
    else:
        return parsed
    print("  SYNOPSIS (stand-in usage)")
    print("Error: (-22) Invalid argument")
    return None


def _aws_slots(sysfs: Path) -> list[tuple[str, str]]:
    """``(management address, application address)`` in the SDK's slot order."""
    managers = []
    devices = sysfs / "bus" / "pci" / "devices"
    for entry in sorted(devices.iterdir()):
        vendor = (entry / "vendor").read_text().strip() if (entry / "vendor").exists() else ""
        device = (entry / "device").read_text().strip() if (entry / "device").exists() else ""
        if vendor == AWS_VENDOR and device in AWS_MANAGEMENT:
            match = SBDF.match(entry.name)
            assert match is not None
            dev, fn = int(match[4], 16), int(match[5])
            if AWS_MANAGEMENT[device] == "f1":
                app = f"{match[2]}:{match[3]}:{dev - 1:02x}.{fn}"
            else:
                app = f"{match[2]}:{match[3]}:{dev:02x}.0"
            managers.append((entry.name, app))
    return managers[:FPGA_SLOT_MAX]


def _aws_show(config: dict[str, object], slot: int, app: str, headers: bool) -> None:
    state = _aws_state(config).get(str(slot), {})
    agfi, status = state.get("agfi", "none"), state.get("status", "cleared")
    code = {"loaded": 0, "cleared": 1}.get(status, 7)
    if headers:
        print("Type  FpgaImageSlot  FpgaImageId             StatusName    StatusCode   "
              "ErrorName    ErrorCode   ShVersion")
    # printf("%-10s  %2u       %-22s", ...) then ("  %-8s         %2d        %-8s        %2d"
    # "       0x%08x\n", ...): cli_show_image_info in fpga_local_cmd.c
    print(f"{'AFI':<10}  {slot:>2}       {agfi:<22}"
          f"  {status:<8}         {code:>2}        {'ok':<8}        {0:>2}"
          f"       0x{SHELL_VERSION:08x}")
    function = Path(str(config["sysfs"])) / "bus" / "pci" / "devices" / app
    if headers:
        print("Type  FpgaImageSlot  VendorId    DeviceId    DBDF")
    if function.exists():
        vendor = int((function / "vendor").read_text(), 16)
        device = int((function / "device").read_text(), 16)
        print(f"{'AFIDEVICE':<10}  {slot:>2}       0x{vendor:04x}      0x{device:04x}      {app}")
    else:
        print(f"{'AFIDEVICE':<10}    unknown    unknown    unknown")


def _aws_state(config: dict[str, object]) -> dict[str, dict[str, str]]:
    path = Path(str(config["state"]))
    return json.loads(path.read_text()) if path.exists() else {}


def _aws_slot(config: dict[str, object], text: str | None) -> tuple[int, str] | int:
    if text is None:
        print("  SYNOPSIS (stand-in usage)")
        print("Error: (-22) Invalid argument")
        return _AWS_USAGE_ERROR
    slot = strtoul(text)
    if slot is None or slot >= FPGA_SLOT_MAX:
        print(f"fpga-image-slot must be less than {FPGA_SLOT_MAX}")
        print("Error: (-22) Invalid argument")
        return _AWS_USAGE_ERROR
    slots = _aws_slots(Path(str(config["sysfs"])))
    if slot >= len(slots):
        print("Error: (20) pci-device-missing")
        return 20
    return slot, slots[slot][1]


def aws_load(config: dict[str, object], argv: list[str]) -> int:
    args = _aws_args(argv, {"-S": "slot", "--fpga-image-slot": "slot", "-I": "agfi",
                            "--fpga-image-id": "agfi", "--request-timeout": "request",
                            "--sync-timeout": "sync"},
                     {"-A": "async", "--async": "async", "-H": "headers", "--headers": "headers",
                      "-F": "force", "--force-shell-reload": "force", "-P": "prefetch",
                      "--prefetch-image": "prefetch"})
    if args is None:
        return _AWS_USAGE_ERROR
    if "agfi" not in args:
        print("Error: (-22) Invalid argument")
        return _AWS_USAGE_ERROR
    where = _aws_slot(config, args.get("slot"))
    if isinstance(where, int):
        return where
    slot, app = where
    if not AGFI.match(args["agfi"]):
        print("Error: (5) invalid-afi-id")
        print("The agfi id passed is invalid or you do not have permission to load\nthe AFI.")
        return 5
    pause(config)
    if config["fail"]:
        print(f"Error: (7) {config['fail']}")
        return 7
    state = _aws_state(config)
    state[str(slot)] = {"agfi": args["agfi"], "status": "loaded"}
    Path(str(config["state"])).write_text(json.dumps(state))
    if "async" not in args:
        _aws_show(config, slot, app, "headers" in args)
    return 0


def aws_describe(config: dict[str, object], argv: list[str]) -> int:
    args = _aws_args(argv, {"-S": "slot", "--fpga-image-slot": "slot",
                            "--request-timeout": "request"},
                     {"-M": "metrics", "--metrics": "metrics", "-C": "metrics",
                      "--clear-metrics": "metrics", "-L": "metrics", "--clear-cache": "metrics",
                      "-R": "rescan", "--rescan": "rescan", "-H": "headers",
                      "--headers": "headers"})
    if args is None:
        return _AWS_USAGE_ERROR
    where = _aws_slot(config, args.get("slot"))
    if isinstance(where, int):
        return where
    slot, app = where
    _aws_show(config, slot, app, "headers" in args)
    return 0
