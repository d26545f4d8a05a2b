"""One admission request through a ValidatingAdmissionPolicy and its bindings, as an API server
decides it, with the policy's own CEL run by cel-python (a real CEL implementation).

What is modelled, after k8s.io/apiserver ``pkg/admission/plugin/policy`` at kubernetes-1.36.2
(line numbers of that tag) and the admissionregistration.k8s.io/v1 API documentation:

* matching: the policy's ``matchConstraints.resourceRules`` (group, version, resource,
  operation) and ``namespaceSelector``, then the binding's ``matchResources`` (it can only
  narrow). ``matchPolicy: Equivalent`` with a rule naming resource.k8s.io ``v1``: a claim sent
  as v1beta1 or v1beta2 is converted to v1 first ("a request to apps/v1beta1 ... would be
  converted to apps/v1 and sent to the ValidatingAdmissionPolicy"), here by the emulated API
  server's own conversion (compat_tests/apiserver/convert.py);
* parameters, looked up per binding right after it matches and before anything of the policy
  is evaluated (validating/dispatcher.go:146-166, generic/policy_dispatcher.go CollectParams):
  no ``paramRef``: one evaluation with ``params`` null (policy_dispatcher.go:320-323); by name
  or by label selector in its namespace; none found with ``parameterNotFoundAction: Deny`` is
  a configuration error (policy_dispatcher.go:376-378) that refuses under ``failurePolicy:
  Fail`` and admits under ``Ignore`` (dispatcher.go:76-99), with ``Allow`` nothing is
  evaluated; with several, each is evaluated and any refusal refuses;
* ``matchConditions``, per parameter, before the validations (validating/validator.go:103-121),
  with ``object``, ``request`` and ``params`` only (no ``variables``, no ``namespaceObject``:
  matchconditions/matcher.go:82): one false skips the policy for that parameter, an error
  refuses under ``Fail``;
* ``variables``, evaluated lazily and at most once per evaluation, as the server's composition
  does, so a variable no expression reaches never fails a request;
* ``validations``: false refuses with ``messageExpression``'s text (or ``message``); an
  evaluation error refuses under ``failurePolicy: Fail``, admits under ``Ignore``;
* several bindings of one policy (``admit_all``): each is decided on its own and any refusal
  refuses.

Not modelled (only a real API server can tell): type checking against the kinds' schemas,
the cost limits, how a namespaceObject or a parameter is fetched from the server's caches.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import celpy
from celpy import celtypes

from compat_tests import cel_devices
from compat_tests.apiserver import convert


@dataclass(frozen=True)
class Request:
    """What a client sends: an object of ``api_version``/``kind`` to ``resource`` (plural)."""

    operation: str
    resource: str
    obj: Mapping[str, Any]
    namespace: str

    @property
    def group_version(self) -> tuple[str, str]:
        group, _, version = str(self.obj["apiVersion"]).rpartition("/")
        return group, version


@dataclass
class Decision:
    """The server's answer: admitted, or refused with the message a client would see."""

    matched: bool
    allowed: bool
    messages: list[str] = field(default_factory=list)


_ENVIRONMENT = celpy.Environment()


@cache
def program(expression: str) -> celpy.Runner:
    """The compiled expression; ``celpy.CELParseError`` if it does not parse."""
    return _ENVIRONMENT.program(_ENVIRONMENT.compile(expression),
                                functions=cel_devices.FUNCTIONS)


def expressions(policy: Mapping[str, Any]) -> list[str]:
    """Every CEL expression of a policy: variables, validations and their messages, match
    conditions and audit annotations."""
    spec = policy["spec"]
    found = [v["expression"] for v in spec.get("variables", [])]
    found += [c["expression"] for c in spec.get("matchConditions", [])]
    for validation in spec.get("validations", []):
        found.append(validation["expression"])
        if "messageExpression" in validation:
            found.append(validation["messageExpression"])
    found += [a["valueExpression"] for a in spec.get("auditAnnotations", [])]
    return found


def _selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector; an absent or empty one matches everything."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for term in selector.get("matchExpressions", []):
        key, operator, values = term["key"], term["operator"], term.get("values", [])
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _rule_matches(rule: Mapping[str, Any], group: str, version: str, resource: str,
                  operation: str) -> bool:
    def has(key: str, value: str) -> bool:
        return "*" in rule.get(key, []) or value in rule.get(key, [])

    return (has("apiGroups", group) and has("apiVersions", version)
            and has("resources", resource) and has("operations", operation))


def _matched_version(constraints: Mapping[str, Any], request: Request) -> str | None:
    """The version the policy sees the object in, or None when no rule covers the request."""
    group, version = request.group_version
    rules = constraints.get("resourceRules", [])
    if any(_rule_matches(r, group, version, request.resource, request.operation)
           for r in rules):
        return version
    if constraints.get("matchPolicy", "Equivalent") != "Equivalent" or group != convert.GROUP:
        return None
    # Every served resource.k8s.io version is equivalent to the stored v1.
    if any(_rule_matches(r, group, convert.HUB, request.resource, request.operation)
           for r in rules):
        return convert.HUB
    return None


def _as_version(request: Request, version: str) -> dict[str, Any]:
    obj = copy.deepcopy(dict(request.obj))
    if version == request.group_version[1]:
        return obj
    if request.resource == "resourceclaimtemplates":
        # A template's spec.spec is a claim's spec: convert it as the claim's.
        inner = convert.to_hub("resourceclaims", request.group_version[1],
                               {"spec": obj["spec"]["spec"]})
        obj["spec"]["spec"] = inner["spec"]
        obj["apiVersion"] = convert.api_version(version)
        return obj
    return convert.to_hub(request.resource, request.group_version[1], obj)


def _params(binding: Mapping[str, Any], request: Request,
            objects: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]] | None:
    """The parameter objects the binding resolves to; None when it has no paramRef."""
    ref = binding["spec"].get("paramRef")
    if ref is None:
        return None
    namespace = ref.get("namespace", request.namespace)
    found = [o for o in objects if o["kind"] == "ConfigMap"
             and o["metadata"].get("namespace") == namespace]
    if "name" in ref:
        return [o for o in found if o["metadata"]["name"] == ref["name"]]
    return [o for o in found
            if _selector_matches(ref.get("selector"), o["metadata"].get("labels", {}))]


class _Variables(celtypes.MapType):
    """``variables``: each evaluated on first use, once, as the server's lazy composition."""

    def __init__(self, definitions: Mapping[str, str], activation: dict[str, Any]) -> None:
        super().__init__({})
        self._definitions = definitions
        self._activation = activation
        self._values: dict[str, Any] = {}

    def __getitem__(self, key: Any) -> Any:
        name = str(key)
        if name not in self._definitions:
            raise KeyError(name)
        if name not in self._values:
            self._values[name] = program(self._definitions[name]).evaluate(self._activation)
        return self._values[name]


def _activation(policy: Mapping[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    activation: dict[str, Any] = {k: celpy.json_to_cel(v) for k, v in values.items()}
    activation["variables"] = _Variables(
        {v["name"]: v["expression"] for v in policy["spec"].get("variables", [])}, activation)
    return activation


def _matches(policy: Mapping[str, Any], values: dict[str, Any]) -> bool:
    """The policy's matchConditions: all true, or none; an evaluation error raises. They see
    neither ``variables`` nor ``namespaceObject``: the API server compiles them without
    (k8s.io/kubernetes pkg/apis/admissionregistration/validation validateMatchConditions-
    Expression, a stateless compiler) and refuses a policy whose conditions name them."""
    activation = {k: celpy.json_to_cel(v) for k, v in values.items()
                  if k != "namespaceObject"}
    for condition in policy["spec"].get("matchConditions", []):
        result = program(condition["expression"]).evaluate(activation)
        if isinstance(result, celpy.CELEvalError):
            raise result
        if not isinstance(result, celtypes.BoolType):
            raise TypeError(f"{condition['expression']!r} gave {result!r}, not a bool")
        if not result:
            return False
    return True


def _evaluate(policy: Mapping[str, Any], activation_values: dict[str, Any]) -> list[str]:
    """The messages of the failed validations; an evaluation error raises."""
    activation = _activation(policy, activation_values)
    refusals = []
    for validation in policy["spec"]["validations"]:
        result = program(validation["expression"]).evaluate(activation)
        if isinstance(result, celpy.CELEvalError):
            raise result
        if not isinstance(result, celtypes.BoolType):
            raise TypeError(f"{validation['expression']!r} gave {result!r}, not a bool")
        if result:
            continue
        message = validation.get("message", f"failed expression: {validation['expression']}")
        if "messageExpression" in validation:
            # A message that cannot be evaluated, or is empty, gives way to ``message``.
            try:
                text = program(validation["messageExpression"]).evaluate(activation)
            except celpy.CELEvalError:
                text = None
            if isinstance(text, str) and text.strip():
                message = str(text)
        refusals.append(message)
    return refusals


NOT_FOUND = "no params found for policy binding with `Deny` parameterNotFoundAction"
"""The API server's words for a missing parameter under Deny (policy_dispatcher.go:378)."""


def admit(policy: Mapping[str, Any], binding: Mapping[str, Any], request: Request,
          namespace: Mapping[str, Any], objects: Sequence[Mapping[str, Any]] = ()) -> Decision:
    """What the API server answers ``request`` in ``namespace`` (a Namespace object), with
    ``objects`` (ConfigMaps) as the cluster's possible parameters, for one binding."""
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    fail = policy["spec"].get("failurePolicy", "Fail") == "Fail"
    constraints = policy["spec"]["matchConstraints"]
    version = _matched_version(constraints, request)
    labels = namespace["metadata"].get("labels", {})
    bound = binding["spec"].get("matchResources", {})
    if version is None or not _selector_matches(constraints.get("namespaceSelector"), labels) \
            or not _selector_matches(bound.get("namespaceSelector"), labels):
        return Decision(matched=False, allowed=True)
    # The parameters first: nothing of the policy has been evaluated yet.
    params = _params(binding, request, objects)
    if params == [] and binding["spec"]["paramRef"].get("parameterNotFoundAction") == "Deny":
        return Decision(matched=True, allowed=not fail,
                        messages=[f"failed to configure binding: {NOT_FOUND}"] if fail else [])
    obj = _as_version(request, version)
    base = {
        "object": obj,
        "oldObject": None,
        "namespaceObject": dict(namespace),
        "request": {
            "operation": request.operation,
            "namespace": request.namespace,
            "kind": {"group": request.group_version[0], "version": version,
                     "kind": obj["kind"]},
            "resource": {"group": request.group_version[0], "version": version,
                         "resource": request.resource},
            "name": obj.get("metadata", {}).get("name", ""),
        },
    }
    messages: list[str] = []
    for param in params if params is not None else [None]:
        try:
            if _matches(policy, {**base, "params": param}):
                messages += _evaluate(policy, {**base, "params": param})
        except (celpy.CELEvalError, TypeError, KeyError) as exc:
            if fail:
                messages.append(f"evaluation error: {exc}")
    return Decision(matched=True, allowed=not messages, messages=messages)


def admit_all(policy: Mapping[str, Any], bindings: Sequence[Mapping[str, Any]],
              request: Request, namespace: Mapping[str, Any],
              objects: Sequence[Mapping[str, Any]] = ()) -> Decision:
    """``admit`` through every binding of ``policy``: any refusal refuses."""
    decisions = [admit(policy, b, request, namespace, objects) for b in bindings]
    return Decision(matched=any(d.matched for d in decisions),
                    allowed=all(d.allowed for d in decisions),
                    messages=[m for d in decisions for m in d.messages])
