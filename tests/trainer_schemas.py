"""Validate a TrainJob or ClusterTrainingRuntime the way the Kubernetes API server validates a
custom resource created with strict field validation (`kubectl create --validate=strict`), against
the CRDs of the pinned Kubeflow Trainer release vendored in tests/kubeflow_trainer/ (offline).

    import trainer_schemas
    trainer_schemas.validate(body)  # raises ValueError naming the path of the first problem

What the API server does and this module does too (apiextensions-apiserver, structural schemas):
unknown fields are errors wherever the schema lists `properties` without
`x-kubernetes-preserve-unknown-fields` (strict decoding reports what pruning would drop); keys set
to null are pruned first (the CRDs declare nothing `nullable`); a required field with a `default`
may be left out (defaulting fills it in before validation); `x-kubernetes-int-or-string` takes an
integer or a string; `x-kubernetes-list-type` set/map lists refuse duplicate items/keys; `status`
is dropped (the CRDs have a status subresource: a create ignores it); the object's own `metadata`
is checked loosely (name, namespace, labels, annotations only, as the API server's ObjectMeta
validation is not the CRD's). The CRDs' CEL rules (`x-kubernetes-validations`) are evaluated by
the Python twins in CEL_RULES below, except the transition rules (`self == oldSelf`, "field is
immutable"), which only run on update.

Not checked: `format` (int32/int64 ranges, date-time, ...), ObjectMeta syntax (label keys and
values, name for a cluster-scoped object), and Trainer's admission webhooks (the referenced runtime
exists, runtimePatches agree with it, ...), which need a running control plane.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import jsonschema
import yaml

TRAINER_VERSION = "v2.3.0"
VENDORED = Path(__file__).resolve().parent / "kubeflow_trainer" / TRAINER_VERSION
CRDS = {
    "TrainJob": VENDORED / "trainer.kubeflow.org_trainjobs.yaml",
    "ClusterTrainingRuntime": VENDORED / "trainer.kubeflow.org_clustertrainingruntimes.yaml",
}
# x-kubernetes-* extensions that decide what validates; list-map-keys and map-type are read or
# only steer server-side apply. Any other one in a refreshed CRD stops the loader.
EXTENSIONS = {
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
}
LOOSE_METADATA = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
_RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$")
_POLICIES = ("torch", "mpi", "jax", "xgboost", "flux")
_MANAGERS = ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue")

# Every non-transition CEL rule of the vendored CRDs, as `self -> bool` (CEL's has(x.f) is "key
# present"). A rule missing here stops the loader, so refreshing the CRDs means reviewing them.
CEL_RULES: dict[str, Callable[[object], bool]] = {
    # TrainJob (the object itself; spec.initializer.*.storageUri; spec.managedBy; status)
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')": (
        lambda self: bool(_RFC1035.search(self["metadata"]["name"]))
    ),
    "size(self.metadata.name) <= 63": lambda self: len(self["metadata"]["name"]) <= 63,
    "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')": (
        lambda self: self == "" or bool(_URI.search(self))
    ),
    "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']": (
        lambda self: self in _MANAGERS
    ),
    "has(self.lastUpdatedTime)": lambda self: "lastUpdatedTime" in self,
    # ClusterTrainingRuntime (spec.mlPolicy and its flux/torch policies; the JobSet template)
    "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)]"
    ".filter(x, x).size() <= 1": lambda self: sum(p in self for p in _POLICIES) <= 1,
    "self >= 1": lambda self: self >= 1,
    "!self.exists(c, c == 'node')": lambda self: "node" not in self,
    "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
    "self.replicatedJobs.exists(x, has(x.dependsOn)))": lambda self: (
        not (
            self.get("startupPolicy", {}).get("startupPolicyOrder") == "InOrder"
            and any("dependsOn" in job for job in self["replicatedJobs"])
        )
    ),
    "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)": (
        lambda self: all(not t.get("metadata", {}).get("namespace") for t in self["templates"])
    ),
}


def _is_transition_rule(rule: str) -> bool:
    return "oldSelf" in rule


def _structural(schema: dict) -> dict:
    """A structural schema node as plain JSON Schema (draft 4, OpenAPI v3.0's base)."""
    node = {k: v for k, v in schema.items() if k not in ("properties", "items")}
    unknown = {k for k in node if k.startswith("x-")} - EXTENSIONS
    if unknown or "nullable" in node:
        raise NotImplementedError(f"schema uses {sorted(unknown) or 'nullable'}")
    for rule in node.get("x-kubernetes-validations", []):
        if not _is_transition_rule(rule["rule"]) and rule["rule"] not in CEL_RULES:
            raise NotImplementedError(f"CEL rule not in CEL_RULES: {rule['rule']}")
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _structural(node["additionalProperties"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            node[key] = [_structural(s) for s in node[key]]
    if "items" in schema:
        node["items"] = _structural(schema["items"])
    if node.get("x-kubernetes-int-or-string"):
        node.pop("type", None)
        node.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if "properties" in schema:
        node["properties"] = {k: _structural(v) for k, v in schema["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        defaulted = {k for k, v in schema["properties"].items() if "default" in v}
        if "required" in node:
            node["required"] = [k for k in node["required"] if k not in defaulted]
    return node


def _cel(validator, rules, instance, schema) -> Iterator[jsonschema.ValidationError]:
    for rule in rules:
        if _is_transition_rule(rule["rule"]):
            continue
        try:
            holds = CEL_RULES[rule["rule"]](instance)
        except (KeyError, TypeError):  # a field missing or mistyped: the schema reports it
            continue
        if not holds:
            yield jsonschema.ValidationError(rule.get("message") or f"failed rule: {rule['rule']}")


def _list_type(validator, list_type, instance, schema) -> Iterator[jsonschema.ValidationError]:
    if not validator.is_type(instance, "array") or list_type == "atomic":
        return
    keys = schema.get("x-kubernetes-list-map-keys", [])
    item_schema = schema.get("items", {}).get("properties", {})
    seen = []
    for index, item in enumerate(instance):
        if list_type == "map" and isinstance(item, dict):
            key = tuple(item.get(k, item_schema.get(k, {}).get("default")) for k in keys)
        else:
            key = item
        if key in seen:
            yield jsonschema.ValidationError(f"duplicate entry {key!r}", path=[index])
        seen.append(key)


Validator = jsonschema.validators.extend(
    jsonschema.Draft4Validator,
    {"x-kubernetes-validations": _cel, "x-kubernetes-list-type": _list_type},
)


@functools.cache
def _validator(kind: str, api_version: str) -> jsonschema.protocols.Validator:
    crd = yaml.load(CRDS[kind].read_text(), Loader=yaml.CSafeLoader)
    group = crd["spec"]["group"]
    (version,) = [
        v for v in crd["spec"]["versions"] if f"{group}/{v['name']}" == api_version and v["served"]
    ]
    schema = _structural(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = LOOSE_METADATA
    schema["properties"]["apiVersion"] = {"enum": [api_version]}
    schema["properties"]["kind"] = {"enum": [kind]}
    schema["required"] = ["apiVersion", "kind", "metadata", *schema.get("required", [])]
    return Validator(schema)


def _without_nulls(value: object) -> object:
    """Kubernetes prunes null values of fields that are not nullable before it validates."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _where(error: jsonschema.ValidationError) -> str:
    """The JSON path Kubernetes names (spec.trainer.env[1].name), down to the offending field."""
    path = list(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = error.schema.get("properties", {})
        path.append(next(k for k in error.instance if k not in known))
    elif error.validator == "required":
        path.append(next(k for k in error.validator_value if k not in error.instance))
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".") or "<root>"


def _what(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        return "unknown field"
    if error.validator == "required":
        return "Required value"
    return error.message


def validate(obj: dict) -> None:
    """Raise ValueError naming the path of the first problem (all of them listed after it) if the
    TrainJob or ClusterTrainingRuntime `obj` would be refused by the API server's schema checks."""
    kind, api_version = obj.get("kind"), obj.get("apiVersion")
    if kind not in CRDS:
        raise ValueError(f"kind: {kind!r} is not one of {sorted(CRDS)}")
    try:
        validator = _validator(kind, api_version)
    except ValueError:  # no served version of that name
        raise ValueError(f"apiVersion: {api_version!r} is not served for {kind}") from None
    body = _without_nulls({k: v for k, v in obj.items() if k != "status"})
    problems = sorted(f"{_where(e)}: {_what(e)}" for e in validator.iter_errors(body))
    if problems:
        more = "".join(f"\n  {p}" for p in problems[1:])
        raise ValueError(f"{kind} {problems[0]}{more}")
