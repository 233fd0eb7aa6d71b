"""Strict validation of rendered Kubernetes objects against the API's own types, without a cluster.

The official ``kubernetes`` Python client carries every built-in kind as a model class:
``openapi_types`` (attribute -> type) and ``attribute_map`` (attribute -> JSON field). Its own
``ApiClient().deserialize`` drops fields it does not know, so a misspelled field would pass; this
walker rejects unknown fields and wrong types, and builds each model so that the model's own
constructor rejects a missing required field. The ServiceMonitor (a CRD, not in the client) is
checked against the few fields of monitoring.coreos.com/v1 that the manifests use.
"""

from __future__ import annotations

import re
from typing import Any

from kubernetes import client as k8s

# (apiVersion, kind) -> model class of the kinds deploy/k8s may hold.
KINDS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
}
SERVICE_MONITOR = ("monitoring.coreos.com/v1", "ServiceMonitor")

# Quantities are typed str in the client, but the API takes a JSON number too ("gpu: 8").
QUANTITY_FIELDS = frozenset(
    {
        ("V1ResourceRequirements", "limits"),
        ("V1ResourceRequirements", "requests"),
        ("V1EmptyDirVolumeSource", "size_limit"),
    }
)

_LIST = re.compile(r"^(?:list|List)\[(.+)\]$")
_DICT = re.compile(r"^(?:dict\(str, (.+)\)|Dict\[str, (.+)\])$")


class SchemaError(ValueError):
    pass


def _primitive(value: Any, type_name: str, path: str, quantity: bool) -> Any:
    ok: bool
    if type_name == "str":
        ok = isinstance(value, str) or (
            quantity and isinstance(value, (int, float)) and not isinstance(value, bool)
        )
    elif type_name == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif type_name == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif type_name == "bool":
        ok = isinstance(value, bool)
    elif type_name in ("bytes", "datetime", "date"):
        ok = isinstance(value, str)
    elif type_name == "object":  # IntOrString and free-form fields
        ok = True
    else:
        raise SchemaError(f"{path}: unknown type {type_name!r} in the client")
    if not ok:
        raise SchemaError(f"{path}: expected {type_name}, got {type(value).__name__} {value!r}")
    return str(value) if quantity else value


def _walk(value: Any, type_name: str, path: str, quantity: bool = False) -> Any:
    if value is None:
        return None
    m = _LIST.match(type_name)
    if m:
        if not isinstance(value, list):
            raise SchemaError(f"{path}: expected a list, got {type(value).__name__}")
        return [_walk(v, m.group(1), f"{path}[{i}]", quantity) for i, v in enumerate(value)]
    m = _DICT.match(type_name)
    if m:
        if not isinstance(value, dict):
            raise SchemaError(f"{path}: expected a mapping, got {type(value).__name__}")
        inner = m.group(1) or m.group(2)
        return {str(k): _walk(v, inner, f"{path}.{k}", quantity) for k, v in value.items()}
    cls = getattr(k8s, type_name, None)
    if cls is None:
        return _primitive(value, type_name, path, quantity)
    if not isinstance(value, dict):
        raise SchemaError(f"{path}: expected a {type_name} object, got {type(value).__name__}")
    by_json = {j: a for a, j in cls.attribute_map.items()}
    kwargs: dict[str, Any] = {}
    for key, v in value.items():
        attr = by_json.get(key)
        if attr is None:
            raise SchemaError(f"{path}.{key}: unknown field of {type_name}")
        q = (type_name, attr) in QUANTITY_FIELDS
        kwargs[attr] = _walk(v, cls.openapi_types[attr], f"{path}.{key}", q)
    try:
        return cls(**kwargs)
    except ValueError as exc:  # a required field missing, or a value the model refuses
        raise SchemaError(f"{path}: {exc}") from None


# monitoring.coreos.com/v1 ServiceMonitor: the fields the manifests use and their near
# neighbours (a mapping is an object of known fields; [x] a list of x; a str a leaf type).
_RELABEL: dict[str, Any] = {
    "sourceLabels": ["str"],
    "separator": "str",
    "targetLabel": "str",
    "regex": "str",
    "modulus": "int",
    "replacement": "str",
    "action": "str",
}
_ENDPOINT: dict[str, Any] = {
    "port": "str",
    "targetPort": "object",
    "path": "str",
    "scheme": "str",
    "interval": "str",
    "scrapeTimeout": "str",
    "honorLabels": "bool",
    "params": "object",
    "relabelings": [_RELABEL],
    "metricRelabelings": [_RELABEL],
}
_SERVICE_MONITOR: dict[str, Any] = {
    "apiVersion": "str",
    "kind": "str",
    "metadata": "V1ObjectMeta",
    "spec": {
        "jobLabel": "str",
        "targetLabels": ["str"],
        "podTargetLabels": ["str"],
        "selector": "V1LabelSelector",
        "namespaceSelector": {"any": "bool", "matchNames": ["str"]},
        "endpoints": [_ENDPOINT],
        "sampleLimit": "int",
    },
}
_SPEC_REQUIRED = ("selector", "endpoints")


def _walk_crd(value: Any, schema: Any, path: str) -> None:
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise SchemaError(f"{path}: expected an object, got {type(value).__name__}")
        for key, v in value.items():
            if key not in schema:
                raise SchemaError(f"{path}.{key}: unknown field of ServiceMonitor")
            _walk_crd(v, schema[key], f"{path}.{key}")
    elif isinstance(schema, list):
        if not isinstance(value, list):
            raise SchemaError(f"{path}: expected a list, got {type(value).__name__}")
        for i, v in enumerate(value):
            _walk_crd(v, schema[0], f"{path}[{i}]")
    else:
        _walk(value, schema, path)


def validate(obj: Any) -> None:
    """Raise ``SchemaError`` unless ``obj`` (one rendered object) is valid for its kind."""
    if not isinstance(obj, dict):
        raise SchemaError(f"not an object: {obj!r}")
    key = (obj.get("apiVersion"), obj.get("kind"))
    name = f"{key[1]}/{(obj.get('metadata') or {}).get('name')}"
    if key == SERVICE_MONITOR:
        _walk_crd(obj, _SERVICE_MONITOR, name)
        spec = obj.get("spec") or {}
        for field in _SPEC_REQUIRED:
            if field not in spec:
                raise SchemaError(f"{name}.spec: {field} is required")
        return
    model = KINDS.get(key)  # type: ignore[arg-type]
    if model is None:
        raise SchemaError(f"{name}: kind {key} is not one deploy/k8s is checked for")
    _walk(obj, model, name)
