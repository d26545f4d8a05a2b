"""The reference pages say what the code does: every flag, metric and Event reason is in
its table, and every relative link of the README and docs/ leads somewhere.

The lists come from the code itself (the argparse parser, the metrics a running registry
holds, the Event reasons the modules can emit), never from a copy here, so a flag, metric or
reason added without its line in docs/ fails this file. A link is checked as GitHub renders
it: the file must exist and a ``#fragment`` must be the slug of one of its headings
(lower-cased, punctuation but ``-`` and ``_`` dropped, spaces as ``-``, ``-1``, ``-2``... on
repeats; headings inside code fences are not headings).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from compat_tests.apiserver import schema
from plugin.cli.config import build_parser
from plugin.process import metrics, node_events
from plugin.serving.dra import function_audit

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
CHART_README = REPO / "deploy" / "helm" / "accelerator-device-plugin" / "README.md"
FLAGS_PAGE = DOCS / "configuration.md"
MONITORING_PAGE = DOCS / "monitoring.md"


def _outside_fences(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line that is not inside a fenced code block."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        marker = stripped[:3]
        if marker in ("```", "~~~"):
            if fence is None:
                fence = marker
                continue
            if marker == fence:
                fence = None
                continue
        if fence is None:
            yield number, line


def _section(text: str, heading: str) -> str:
    """The lines under ``heading`` (a whole heading line) up to the next heading of its level
    or above."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = list(_outside_fences(text))
    starts = [i for i, (_, line) in enumerate(lines) if line == heading]
    assert len(starts) == 1, f"{heading!r}: {len(starts)} such headings"
    body = []
    for _, line in lines[starts[0] + 1:]:
        found = re.match(r"(#+) ", line)
        if found and len(found[1]) <= level:
            break
        body.append(line)
    return "\n".join(body)


def _first_column(section: str, header: str) -> set[str]:
    """The backquoted names in the first cell of each row of the table whose first header
    cell is ``header``."""
    names: set[str] = set()
    in_table = False
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            if in_table:
                break
            continue
        if not in_table:
            in_table = cells[0] == header
            continue
        names.update(re.findall(r"`([^`]+)`", cells[0]))
    assert names, f"no table headed {header!r}"
    return names


# -- flags -------------------------------------------------------------------------------------

def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (commands,) = [action for action in parser._actions
                   if isinstance(action, argparse._SubParsersAction)]
    return {"": parser, **commands.choices}


def _flags() -> dict[str, set[str]]:
    """Every option string of every subcommand (and of the top level), with where it is."""
    found: dict[str, set[str]] = {}
    for name, parser in _subcommands().items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                found.setdefault(option, set()).add(name or "(before the subcommand)")
    return found


def _documented_flags() -> set[str]:
    section = _section(FLAGS_PAGE.read_text(), "## Command line")
    return {name.split()[0] for name in _first_column(section, "flag")}


def test_the_parser_has_the_subcommands_a_user_runs():
    # What the next test walks: a parser that lost its subcommands would pass it vacuously.
    assert {"serve", "discover", "healthcheck", "loader"} <= set(_subcommands())
    assert {"--backend", "--api", "--json", "--heartbeat-file"} <= set(_flags())


def test_every_flag_of_every_subcommand_is_in_the_flags_table():
    documented = _documented_flags()
    missing = {flag: sorted(where) for flag, where in _flags().items() if flag not in documented}
    assert not missing, (
        f"flags without a row in {FLAGS_PAGE.relative_to(REPO)}'s table "
        f"(## Command line): {missing}")


# -- metrics -----------------------------------------------------------------------------------

_REGISTERED = """
import json, prometheus_client
from plugin.process import metrics
metrics._Prometheus("127.0.0.1", 0)
names = []
for family in prometheus_client.REGISTRY.collect():
    if family.name.startswith(metrics.NAMESPACE + "_"):
        suffix = "_total" if family.type == "counter" else ""
        names.append(family.name[len(metrics.NAMESPACE) + 1:] + suffix)
print(json.dumps(names))
"""


def _registered_metrics() -> set[str]:
    """The metric families a serve with ``--metrics-port`` registers, as ``/metrics`` names
    them (without the common prefix); read from prometheus-client's registry in a process of
    its own, so that no other test's registry state counts."""
    done = subprocess.run([sys.executable, "-c", _REGISTERED], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)
    return set(json.loads(done.stdout))


def _documented_metrics() -> set[str]:
    section = _section(MONITORING_PAGE.read_text(), "## Metrics")
    return _first_column(section, "metric")


def test_every_registered_metric_is_in_the_metrics_table_and_no_other():
    registered = _registered_metrics()
    assert {"build_info", "devices", "registrations_total", "dra_programming_seconds"} <= registered
    documented = _documented_metrics()
    assert not registered - documented, (
        f"metrics without a row in {MONITORING_PAGE.relative_to(REPO)} (## Metrics): "
        f"{sorted(registered - documented)}")
    assert not documented - registered, (
        f"rows of {MONITORING_PAGE.relative_to(REPO)} (## Metrics) for metrics the code does "
        f"not register: {sorted(documented - registered)}")
    assert metrics.NAMESPACE in MONITORING_PAGE.read_text()


# -- Event reasons -----------------------------------------------------------------------------

def _reasons_in_occurrences() -> set[str]:
    """Every reason given to an ``Occurrence`` anywhere in plugin/ as a literal or as a module
    constant of the module that builds it."""
    reasons: set[str] = set()
    for path in (REPO / "plugin").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        constants = {target.id: node.value.value
                     for node in tree.body if isinstance(node, ast.Assign)
                     and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                     for target in node.targets if isinstance(target, ast.Name)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "Occurrence"):
                continue
            given = [kw.value for kw in node.keywords if kw.arg == "reason"] or node.args[1:2]
            for reason in given:
                if isinstance(reason, ast.Constant) and isinstance(reason.value, str):
                    reasons.add(reason.value)
                elif isinstance(reason, ast.Name) and reason.id in constants:
                    reasons.add(constants[reason.id])
    return reasons


def _event_reasons() -> set[str]:
    """What the code can write as an Event's reason: the Node's reasons (node_events' reason
    constants, its actions aside), the claim audit's, and any other Occurrence's."""
    source = ast.parse(Path(node_events.__file__).read_text())
    defined = {target.id for node in source.body if isinstance(node, ast.Assign)
               for target in node.targets if isinstance(target, ast.Name)}
    on_node = {value for name, value in vars(node_events).items()
               if name in defined and name.isupper() and isinstance(value, str)
               and not name.endswith("_ACTION")
               and re.fullmatch(r"(?:[A-Z][a-z]+)+(?:CDI)?", value)}
    return on_node | set(function_audit.EVENT_REASONS.values()) | _reasons_in_occurrences()


def test_every_event_reason_is_in_the_events_table():
    reasons = _event_reasons()
    assert {"DeviceUnhealthy", "ServingAPIChanged", "RuntimeWithoutCDI", "FunctionNotAllowed",
            "ImageDigestMismatch"} <= reasons
    section = _section(MONITORING_PAGE.read_text(), "## Events")
    documented = _first_column(section, "reason")
    assert not reasons - documented, (
        f"Event reasons without a row in {MONITORING_PAGE.relative_to(REPO)} (## Events): "
        f"{sorted(reasons - documented)}")
    assert not documented - reasons, (
        f"rows of {MONITORING_PAGE.relative_to(REPO)} (## Events) for reasons the code never "
        f"writes: {sorted(documented - reasons)}")


# -- links -------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: links and code marks rendered to their text,
    lower-cased, every character but letters, digits, spaces, ``-`` and ``_`` dropped, spaces
    as ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in _outside_fences(path.read_text()):
        heading = re.match(r"#{1,6} +(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        base = slug(heading[1])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.glob("*.md")), CHART_README]


def _relative_links(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in _outside_fences(path.read_text()):
        line = re.sub(r"`[^`]*`", "", line)  # code spans are not links
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                yield number, target


def broken_links(path: Path) -> list[str]:
    broken = []
    for number, target in _relative_links(path):
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(REPO)}:{number}: {target}"
        if not linked.exists():
            broken.append(f"{where} (no such file)")
        elif fragment and (linked.suffix != ".md" or fragment not in anchors(linked)):
            broken.append(f"{where} (no heading with that anchor)")
    return broken


def test_slugs_follow_githubs_rules():
    assert slug("Registering: `kubelet.sock` or the plugin watcher") == \
        "registering-kubeletsock-or-the-plugin-watcher"
    assert slug("Pinning a node: the label `accelerator.b-com.com/api`") == \
        "pinning-a-node-the-label-acceleratorb-comcomapi"
    assert slug("Which runtimes apply CDI, and what DRA does about it") == \
        "which-runtimes-apply-cdi-and-what-dra-does-about-it"
    assert slug("Without a cluster: `make demo` and `make test`") == \
        "without-a-cluster-make-demo-and-make-test"


def test_a_link_to_a_missing_file_or_heading_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "other.md").write_text("# Title\n\n## A section\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-section) [ok](#here) `[code](nowhere.md)`\n"
                    "[gone](missing.md) [no anchor](other.md#not-a-heading)\n## Here\n")
    assert broken_links(page) == ["page.md:2: missing.md (no such file)",
                                  "page.md:2: other.md#not-a-heading (no heading with that anchor)"]


@pytest.mark.parametrize("path", _pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_leads_to_a_file_and_heading(path):
    assert not broken_links(path), "\n".join(broken_links(path))


def test_the_pages_have_links_to_check():
    assert sum(len(list(_relative_links(path))) for path in _pages()) > 50


def test_the_readme_reaches_every_page_of_docs_in_one_click():
    linked = {(REPO / target.partition("#")[0]).resolve()
              for _, target in _relative_links(REPO / "README.md")}
    unreached = [page.name for page in DOCS.glob("*.md") if page.resolve() not in linked]
    assert not unreached, f"docs/ pages the README does not link: {unreached}"


# -- the README's own commands and examples ----------------------------------------------------

def _code_blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), re.MULTILINE | re.DOTALL)


def test_the_readme_gives_exactly_the_two_make_commands_and_the_makefile_has_them():
    (block,) = [b for b in _code_blocks(REPO / "README.md", "sh") if "make demo" in b]
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert commands == ["make demo", "make test"]
    targets = re.findall(r"^([\w.-]+):", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert {"demo", "test"} <= set(targets)


def test_the_readmes_first_pods_ask_for_what_the_deployment_provides():
    pod_example = yaml.safe_load((REPO / "deploy" / "pod-example.yml").read_text())
    (limits,) = [c["resources"]["limits"] for c in pod_example["spec"]["containers"]]
    assert limits["b-com.com/accelerator"] == 1
    class_ = yaml.safe_load(
        (REPO / "deploy" / "components" / "dra" / "cluster" / "deviceclass.yaml").read_text())
    assert class_["spec"]["extendedResourceName"] == "b-com.com/accelerator"

    (block,) = [b for b in _code_blocks(REPO / "README.md", "yaml") if "ResourceClaimTemplate" in b]
    template, pod = yaml.safe_load_all(block)
    v1 = schema.load("v1")
    assert set(template) <= set(v1["io.k8s.api.resource.v1.ResourceClaimTemplate"]["properties"])
    assert set(template["spec"]) <= set(
        v1["io.k8s.api.resource.v1.ResourceClaimTemplateSpec"]["properties"])
    claim = {"apiVersion": template["apiVersion"], "kind": "ResourceClaim",
             "metadata": {"name": "c"}, "spec": template["spec"]["spec"]}
    decoded = schema.decode(claim, "resourceclaims", "v1", drop_unknown=False)
    assert decoded.unknown == [] and decoded.errors == []
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == class_["metadata"]["name"]
    (claim_ref,) = pod["spec"]["resourceClaims"]
    assert claim_ref["resourceClaimTemplateName"] == template["metadata"]["name"]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["claims"] == [{"name": claim_ref["name"]}]
