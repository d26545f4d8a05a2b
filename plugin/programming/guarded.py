"""Which functions are guarded, and which namespaces a guard lets through: pure rules.

The admin's catalogue (docs/programming.md, "Which namespaces may use which function") names
the guarded DeviceClasses; a namespace is granted a class by the label
``functions.accelerator.b-com.com/<class>=true`` on its Namespace (exactly ``true``).
Admission refuses a claim or a pod that *names* a guarded class in a namespace without the
grant; what it cannot see is a claim of another class (the plain ``accelerator.b-com.com``,
``b-com.com/accelerator``, a class an admin adds later) landing on a device that *holds* a
guarded function, whole or as a share. The driver closes that at prepare, by function:

* a function is guarded when a guarded class names it: its own ``FpgaFunction`` function or
  one of its ``allowedClaimFunctions`` (its ``clearOnUnprepare`` is what a card is left
  holding, not what the class offers, and is not guarded by it);
* a namespace may reach a guarded function when it is granted any guarded class naming it;
* where the driver cannot tell, it fails closed: a guarded class whose configuration cannot
  be read could name any function, so a device holding a function no readable class guards
  is refused unless the namespace is granted every such class; with no catalogue at all
  (nothing read yet, the classes unreadable) every device holding a function is refused.

Nothing here does I/O: :mod:`plugin.serving.dra.function_grants` reads the objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from plugin.programming.function_config import function_shown, parse_config

GRANT_LABEL_PREFIX = "functions.accelerator.b-com.com/"
"""A Namespace label ``<prefix><class>`` valued exactly ``true`` grants the class."""

Function = tuple[str, str]
"""(family, normalised function ID), as :class:`~.function_config.FunctionSpec` has them."""


CATALOGUE_LABELS = {"app.kubernetes.io/name": "accelerator-device-plugin",
                    "app.kubernetes.io/component": "function-admission"}
"""What marks the catalogue ConfigMap, as the admission policy's binding finds it: by label,
so a kustomize ``namePrefix`` or a Helm release name does not lose it."""


@dataclass(frozen=True)
class Unread:
    """A device whose function cannot be read (an AWS slot whose SDK describe fails, or
    that no describe is run for): it may hold any function of its ``family``, so it is not
    taken as holding nothing."""

    family: str
    why: str


@dataclass(frozen=True)
class GrantsSource:
    """``--function-grants <namespace>`` and ``--guarded-classes``."""

    namespace: str
    classes: tuple[str, ...] = ()
    """The catalogue's classes as rendered with the deployment: guarded whatever happens to
    the ConfigMap."""


def granted_classes(labels: Mapping[str, str]) -> frozenset[str]:
    """The classes a Namespace's ``labels`` grant (any other value than ``true`` grants
    nothing, as the admission policy reads it)."""
    return frozenset(key[len(GRANT_LABEL_PREFIX):] for key, value in labels.items()
                     if key.startswith(GRANT_LABEL_PREFIX) and value == "true")


def grant_command(namespace: str, device_class: str) -> str:
    return f"kubectl label namespace {namespace} {GRANT_LABEL_PREFIX}{device_class}=true"


@dataclass(frozen=True)
class GuardedFunctions:
    """What the catalogue guards now, by function."""

    classes: Mapping[Function, frozenset[str]] = field(default_factory=dict)
    """Each guarded function -> the guarded classes naming it."""
    unreadable: Mapping[str, str] = field(default_factory=dict)
    """Guarded class -> why its configuration cannot be read (it may name any function)."""
    blind: str = ""
    """Why nothing can be told at all (the classes unreadable, nothing read yet): every
    device holding a function is taken as guarded. Empty: the catalogue is known."""
    assumed: str = ""
    """Why every class naming a function is taken as guarded (the catalogue itself cannot
    be read), said with each refusal; empty: the catalogue was read."""

    def guards(self, function: Function | None) -> bool:
        """Whether a device holding ``function`` (None: nothing) is published guarded."""
        if function is None:
            return False
        return bool(self.blind or self.unreadable or function in self.classes)

    def may_guard(self, family: str) -> bool:
        """Whether a device of ``family`` whose function cannot be read is published
        guarded: it may hold a guarded function (failing closed, as :meth:`unread_refusal`)."""
        return bool(self.blind or self.unreadable
                    or any(guarded == family for guarded, _ in self.classes))

    def refusal(self, namespace: str, function: Function | None,
                granted: frozenset[str] | None, why_not_read: str = "",
                loads: bool = False) -> str | None:
        """Why namespace ``namespace`` (granted ``granted``: None when its Namespace could
        not be read, ``why_not_read`` says why) may not have a device holding ``function``
        (``loads``: that the claim would load there), or None when it may."""
        if function is None:
            return None
        shown = ("the claim would load " if loads else "it holds ") + function_shown(*function)
        if self.blind:
            return (f"{shown}, and which functions are guarded cannot be told "
                    f"({self.blind}), so a device holding a function is refused until it can")
        naming = self.classes.get(function, frozenset())
        if naming:
            if granted is not None and granted & naming:
                return None
            return self._not_granted(namespace, shown, sorted(naming), granted, why_not_read,
                                     "guarded by")
        if not self.unreadable:
            return None
        unknown = sorted(self.unreadable)
        if granted is not None and granted >= set(unknown):
            return None
        return self._not_granted(
            namespace, shown, unknown, granted, why_not_read,
            "held while the configuration of guarded "
            f"DeviceClass{'es' if len(unknown) > 1 else ''} cannot be read "
            f"({'; '.join(f'{c}: {self.unreadable[c]}' for c in unknown)}), so it may be "
            "guarded by")

    def unread_refusal(self, namespace: str, unread: Unread,
                       granted: frozenset[str] | None, why_not_read: str = "") -> str | None:
        """Why ``namespace`` may not have a device whose function cannot be read: it may
        hold any guarded function of its family, so it is refused unless the namespace is
        granted every class that may guard one (failing closed); None when none may."""
        shown = f"the function it holds cannot be read ({unread.why})"
        if self.blind:
            return (f"{shown}, and which functions are guarded cannot be told "
                    f"({self.blind}); refused until either can")
        classes = sorted({c for (family, _), named in self.classes.items()
                          if family == unread.family for c in named} | set(self.unreadable))
        if not classes or (granted is not None and granted >= set(classes)):
            return None
        names = ", ".join(classes)
        whether = (f"whether namespace {namespace} is granted it cannot be told "
                   f"({why_not_read})" if granted is None
                   else f"namespace {namespace} is not granted {'all of ' * (len(classes) > 1)}"
                   f"{'them' if len(classes) > 1 else 'it'}")
        return (f"{shown}, so it may hold a {unread.family} function guarded by DeviceClass "
                f"{names}, and {whether}; refused until its function can be read")

    @staticmethod
    def _not_granted(namespace: str, shown: str, classes: Sequence[str],
                     granted: frozenset[str] | None, why_not_read: str, how: str) -> str:
        names = ", ".join(classes)
        if granted is None:
            return (f"{shown}, an FPGA function {how} DeviceClass {names}, and "
                    f"whether namespace {namespace} is granted it cannot be told "
                    f"({why_not_read}); refused until the Namespace can be read")
        return (f"{shown}, an FPGA function {how} DeviceClass {names}, which "
                f"namespace {namespace} is not granted: an administrator grants it with "
                f"`{grant_command(namespace, classes[0])}`")

    def said(self, refusal: str) -> str:
        """``refusal`` with why the classes were taken as guarded, if they were."""
        return f"{refusal} (every class naming a function is taken as guarded while " \
            f"{self.assumed})" if self.assumed else refusal


def guarded_functions(driver: str, guarded: Iterable[str],
                      configs: Mapping[str, Sequence[object]],
                      every_function_class: str = "") -> GuardedFunctions:
    """The functions named by the ``guarded`` classes, from ``configs`` (DeviceClass name ->
    the opaque parameters of its configurations for ``driver``, as
    :func:`api_versions.device_classes.driver_configs` gives them). A guarded class that
    does not exist names nothing. ``every_function_class``: why the catalogue itself cannot
    be read, so that every class naming a function is taken as guarded (failing closed)."""
    wanted = set(configs) if every_function_class else set(guarded)
    named: dict[Function, set[str]] = {}
    unreadable: dict[str, str] = {}
    for name in sorted(wanted & set(configs)):
        for index, parameters in enumerate(configs[name]):
            try:
                parsed = parse_config(driver, parameters, f"configuration {index}", True)
            except ValueError as exc:
                unreadable[name] = str(exc)
                continue
            for spec in (*((parsed.spec,) if parsed.spec else ()), *parsed.allowed):
                named.setdefault((spec.family, spec.function_id), set()).add(name)
    return GuardedFunctions({f: frozenset(c) for f, c in named.items()}, unreadable,
                            assumed=every_function_class)
