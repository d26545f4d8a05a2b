"""Stand-ins for the vendor tools the loaders run, acting on a fake node's sysfs tree.

:func:`write_stand_in_tools` writes four executables (``#!`` the running interpreter) that
take their arguments as the real tools document them, refuse anything else the way the
real tool does (its message style and exit status), check the image as the tool would,
and then change the fake tree as a real load changes the real one:

* ``fpgaconf`` (OFS/opae-sdk ``binaries/fpgaconf/fpgaconf.c`` and
  ``libraries/argsfilter/argsfilter.c`` at c52aef5aefdacdcc238097e6b8f260f7924f9f04):
  ``[-hVvn] [--force] [--skip-usrclk] [-S|--segment N] [-B|--bus N] [-D|--device N]
  [-F|--function N] [ssss:bb:dd.f] <gbs>``, numbers as ``strtoul(.., 0)`` reads them; the
  FME whose interface ID is the GBS's, among those at the address, must be exactly one (exit
  4 "No suitable slots found.", 5 more than one); slot 0's port gets the GBS's AFU ID.
  ``--opt=value`` is refused: argsfilter removes two words per option, so on the real tool it
  swallows the next argument.
* ``xbutil`` (Xilinx/XRT ``xbutil2/SubCmdProgram.cpp`` at
  67ecb0c862eec7bc4e71b805aa68af2b4fd8da79): ``program [-d|--device BDF] [-u|--user
  XCLBIN] [--help]``; the user function's ``xclbinuuid`` becomes the image's UUID (``%pUb``,
  dashed), as :func:`compat_tests.fake_alveo.load_xclbin` writes it.
* ``fpga-load-local-image`` / ``fpga-describe-local-image`` (aws/aws-fpga
  ``sdk/userspace/fpga_mgmt_tools/src/fpga_local_cmd_parse.c``, ``fpga_local_cmd.c`` at
  fd77a7276ed2e236ed842bae344a2affcad5ae4a): ``-S SLOT -I agfi-... [-A] [-H] [-F] [-P]
  [--request-timeout N] [--sync-timeout N]`` and ``-S SLOT [-M] [-C] [-L] [-R] [-H]``;
  slots are numbered as the SDK numbers management functions; the loaded AGFI is kept in a
  JSON state file, which describe prints in the tools' column format.

Error texts that could not be read from upstream (XRT's shell-mismatch and unknown-BDF
wording, the SDK's missing-slot case) are close approximations; the exit statuses and the
``ERROR:``/``Error: (code) name`` shapes are the real ones.

``delay`` makes each load take that long (for timeouts); ``fail`` makes each load fail at
the hardware step with that text in the tool's error. Every run is appended to
``<directory>/calls.jsonl`` as ``{"tool": ..., "argv": [...], "pid": ..., "at": ...}`` when it
starts, and ``{"tool": ..., "end": <status>, "pid": ..., "at": ...}`` when it ends (``at``:
``time.time()``), so a test can tell whether two runs overlapped (:meth:`StandInTools.spans`).

This module also holds the stand-ins' own GBS reader (:func:`gbs_parts`), written from
OPAE's layout independently of :mod:`plugin.programming.gbs`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from compat_tests.fake_aws_tools import aws_describe, aws_load
from compat_tests.fake_tool_support import SBDF, err, pause, strtoul

if TYPE_CHECKING:
    from compat_tests.fake_sysfs import FakeNode

REPO_ROOT = Path(__file__).resolve().parent.parent
GBS_GUID = bytes.fromhex("58656F6E46504741B747425376303031")
TOOLS = ("fpgaconf", "xbutil", "fpga-load-local-image", "fpga-describe-local-image")


@dataclass(frozen=True)
class GbsParts:
    """What the stand-ins need of a GBS: IDs as 32 lower-case hex digits, the raw bitstream."""

    interface_id: str
    afu_id: str
    bitstream: bytes


def gbs_parts(data: bytes) -> GbsParts:
    """GUID, uint32 LE metadata length, JSON metadata, raw bitstream; ValueError if not."""
    if len(data) < 20 or data[:16] != GBS_GUID:
        raise ValueError("not a GBS (no GBS GUID)")
    length = int.from_bytes(data[16:20], "little")
    if 20 + length > len(data):
        raise ValueError("GBS metadata runs past the end of the file")
    metadata = json.loads(data[20:20 + length].split(b"\0", 1)[0])
    afu = metadata["afu-image"]
    interface = afu["interface-uuid"].replace("-", "").lower()
    first = afu["accelerator-clusters"][0]["accelerator-type-uuid"].replace("-", "").lower()
    return GbsParts(interface, first, data[20 + length:])


def interface_of(card: Path, fme: Path | None) -> str | None:
    """The interface ID of the FME in card directory ``card``: OPAE ``pr/interface_id`` or a
    DFL PR region's ``compat_id``."""
    if fme is None:
        return None
    candidates = [fme / "pr" / "interface_id", *sorted(fme.glob(
        "dfl-fme-region.*/fpga_region/region*/compat_id")), card / "compat_id"]
    for path in candidates:
        if path.is_file():
            return path.read_text().strip().replace("-", "").lower()
    return None


@dataclass(frozen=True)
class StandInTools:
    """Where :func:`write_stand_in_tools` put the tools, their state and their call log."""

    fpgaconf: Path
    xbutil: Path
    load: Path
    describe: Path
    state: Path
    calls: Path

    def invocations(self, tool: str | None = None) -> list[list[str]]:
        """The argv of every run so far (of ``tool`` only, if given)."""
        if not self.calls.exists():
            return []
        runs = [json.loads(line) for line in self.calls.read_text().splitlines()]
        return [r["argv"] for r in runs if "argv" in r and (tool is None or r["tool"] == tool)]

    def spans(self, tool: str) -> list[tuple[float, float | None]]:
        """``(start, end)`` wall-clock times of each run of ``tool``, in start order; end
        None for a run that has not ended (or was killed)."""
        if not self.calls.exists():
            return []
        runs = [json.loads(line) for line in self.calls.read_text().splitlines()]
        ends = {r["pid"]: r["at"] for r in runs if r["tool"] == tool and "end" in r}
        return [(r["at"], ends.get(r["pid"])) for r in runs
                if r["tool"] == tool and "argv" in r]


def write_stand_in_tools(directory: Path, node: FakeNode, *, delay: float = 0.0,
                         fail: str | None = None, fail_at: tuple[str, ...] = ()
                         ) -> StandInTools:
    """The four stand-in tools in ``directory``, acting on ``node``'s trees; ``fail_at``
    (Intel card addresses) makes fpgaconf fail on those cards only."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "stand-in-tools.json"
    state = directory / "aws-slots.json"
    calls = directory / "calls.jsonl"
    config.write_text(json.dumps({
        "sysfs": str(node.sysfs_root), "dev": str(node.dev_root), "state": str(state),
        "calls": str(calls), "delay": delay, "fail": fail,
        "fail_at": list(fail_at)}))
    paths = {}
    for tool in TOOLS:
        path = directory / tool
        path.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n"
                        f"from compat_tests.fake_fpga_tools import main\n"
                        f"sys.exit(main({tool!r}, {str(config)!r}, sys.argv[1:]))\n")
        path.chmod(0o755)
        paths[tool] = path
    return StandInTools(paths["fpgaconf"], paths["xbutil"], paths["fpga-load-local-image"],
                        paths["fpga-describe-local-image"], state, calls)


def main(tool: str, config_path: str, argv: list[str]) -> int:
    """Entry point of the generated scripts."""
    config = json.loads(Path(config_path).read_text())
    with open(config["calls"], "a") as log:
        log.write(json.dumps({"tool": tool, "argv": argv, "pid": os.getpid(),
                              "at": time.time()}) + "\n")
    run = {"fpgaconf": _fpgaconf, "xbutil": _xbutil, "fpga-load-local-image": aws_load,
           "fpga-describe-local-image": aws_describe}[tool]
    status = run(config, argv)
    with open(config["calls"], "a") as log:
        log.write(json.dumps({"tool": tool, "end": status, "pid": os.getpid(),
                              "at": time.time()}) + "\n")
    return status


# fpgaconf ------------------------------------------------------------------------------------

_FILTERS = {"-S": "segment", "--segment": "segment", "-B": "bus", "--bus": "bus",
            "-D": "device", "--device": "device", "-F": "function", "--function": "function"}
_FPGACONF_FLAGS = {"-h", "--help", "-V", "--verbose", "-v", "--version", "-n", "--dry-run",
                   "--force", "--skip-usrclk", "-A", "-I", "-Q"}


def _fpgaconf(config: dict[str, object], argv: list[str]) -> int:
    target: dict[str, int] = {}
    rest: list[str] = []
    words = iter(argv)
    for word in words:
        if word.split("=", 1)[0] in _FILTERS and "=" in word:
            err("Invalid cmdline options")  # argsfilter would drop the next word too
            return 1
        if word in _FILTERS:
            value = next(words, None)
            if value is None:
                err("Missing option argument")
                return 7
            number = strtoul(value)
            if number is None:
                err(f"invalid {_FILTERS[word]}: {value}", "Error failed arg parse: invalid "
                     "parameter")
                return 7
            target[_FILTERS[word]] = number
        else:
            rest.append(word)
    for index, word in enumerate(rest):
        match = SBDF.match(word)
        if match:
            target.update(segment=int(match[2] or "0", 16), bus=int(match[3], 16),
                          device=int(match[4], 16), function=int(match[5]))
            del rest[index]
            break
    files = []
    for word in rest:
        if word.startswith("-") and word != "-":
            if word not in _FPGACONF_FLAGS:
                err("Invalid cmdline options")
                return 1
            if word in ("-h", "--help", "-v", "--version"):
                print("fpgaconf (stand-in)")
                return 1
        else:
            files.append(word)
    if not files:
        err("No GBS file")
        return 1
    gbs_path = Path(files[0])
    if not gbs_path.is_file():
        err('Error locating GBS file specified: "No such file or directory"')
        return 1
    try:
        gbs = gbs_parts(gbs_path.read_bytes())
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        err(f"libbitstream: invalid GBS {gbs_path}: {exc}")
        return 2
    matches = [card for card in _intel_cards(Path(str(config["sysfs"])))
               if card[2] == gbs.interface_id and _at(card[0], target)]
    if not matches:
        err("No suitable slots found.")
        return 4
    if len(matches) > 1:
        err("Found more than one suitable slot, please be more specific.")
        return 5
    pause(config)
    _bdf, card_dir, _interface = matches[0]
    port = next((p for p in sorted(card_dir.iterdir()) if (p / "id").is_file()
                 and (p / "id").read_text().strip() == "0"), None)
    fails = config["fail"] or (_bdf in config.get("fail_at", []) and "PR failed: timeout")
    if fails or port is None:
        why = fails or "Accelerator in use or not found"
        err(f"libopae-c reconf.c: Failed to reconfigure bitstream: {why}",
             "Error writing bitstream to FPGA: reconfiguration error")
        return 5
    (port / "afu_id").write_text(gbs.afu_id + "\n")
    return 0


def _intel_cards(sysfs: Path) -> list[tuple[str, Path, str | None]]:
    """``(PCI address, card directory, interface ID)`` of every card with an FME."""
    cards = []
    for class_dir, fme_glob in (("class/fpga", "intel-fpga-fme.*"),
                                ("class/fpga_region", "dfl-fme.*")):
        base = sysfs / class_dir
        if not base.is_dir():
            continue
        for link in sorted(base.iterdir()):
            card = link.resolve()
            fmes = sorted(card.glob(fme_glob))
            if not fmes or not (card / "device").exists():
                continue
            cards.append(((card / "device").resolve().name, card, interface_of(card, fmes[0])))
    return cards


def _at(bdf: str, target: dict[str, int]) -> bool:
    match = SBDF.match(bdf)
    if match is None:
        return False
    actual = {"segment": int(match[2] or "0", 16), "bus": int(match[3], 16),
              "device": int(match[4], 16), "function": int(match[5])}
    return all(actual[key] == value for key, value in target.items())


# xbutil --------------------------------------------------------------------------------------

def _xbutil(config: dict[str, object], argv: list[str]) -> int:
    if not argv or argv[0] != "program":
        err(f"ERROR: Unknown sub-command: '{argv[0] if argv else ''}'")
        return 1
    options: dict[str, str] = {}
    words = iter(argv[1:])
    for word in words:
        name, _, inline = word.partition("=")
        key = {"-d": "device", "--device": "device", "-u": "user", "--user": "user"}.get(name)
        if word == "--help":
            print("program options (stand-in)")
            return 0
        if key is None:
            err(f"ERROR: unrecognised option '{word}'")
            return 1
        value = inline or next(words, None)
        if value is None:
            err(f"ERROR: the required argument for option '{name}' is missing")
            return 1
        options[key] = value
    sysfs = Path(str(config["sysfs"]))
    users = sorted(p.name for p in (sysfs / "bus" / "pci" / "devices").iterdir()
                   if (p / "user_pf").exists())
    device = options.get("device", "").lower()
    if not device:
        if len(users) != 1:
            err("ERROR: Multiple devices found. Please specify a single device using the "
                 "--device option")
            return 1
        device = users[0]
    if device not in users:
        err(f"ERROR: Specified device BDF '{device}' not found")
        return 1
    if "user" not in options:
        print("\nERROR: Missing program operation. No action taken.\n")
        return 1
    path = Path(options["user"])
    try:
        data = path.read_bytes()
    except OSError as exc:
        err(f"ERROR: Could not open {path} for reading: {exc.strerror}")
        return 1
    if len(data) < 456 or data[:8] != b"xclbin2\0":
        err(f"ERROR: Invalid xclbin file: {path}")
        return 1
    function = sysfs / "bus" / "pci" / "devices" / device
    interface = data[336:352]
    shell = (function / "interface_uuids").read_text().split()
    if any(interface) and interface.hex() not in shell:
        err(f"ERROR: Could not program device {device} : xclbin interface uuid "
             f"{interface.hex()} does not match the shell's {' '.join(shell)}")
        return 1
    pause(config)
    if config["fail"]:
        err(f"ERROR: Could not program device {device} : {config['fail']}")
        return 1
    raw = data[416:432].hex()
    uuid = f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"
    (function / "xclbinuuid").write_text(uuid + "\n")
    print(f"INFO: xrt-smi program succeeded on {device}")
    return 0
