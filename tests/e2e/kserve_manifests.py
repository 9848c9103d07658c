"""KServe resources checked against KServe's own Python SDK models: run by
tests/unit/test_deploy_manifests.py with .venv-kserve's interpreter (imports nothing from lumenrt).

    .venv-kserve/bin/python tests/e2e/kserve_manifests.py FILE.yaml ...

Each file is walked against the SDK's model of its kind (V1alpha1ClusterServingRuntime,
V1beta1InferenceService), through the models they name, KServe's and the Kubernetes client's alike
(both generated from OpenAPI: ``openapi_types`` gives each field's type, ``attribute_map`` its key):
a key no model has, or a value of the wrong type, is reported with its path. The Kubernetes models
on the way (V1Container, ...) are also built with their own ``from_dict``, which checks required
fields. Prints one JSON object: file -> "ok" or the problems.
"""

import json
import re
import sys
from typing import Any

import kserve.models
import kubernetes.client.models
import yaml

KINDS = {
    "ClusterServingRuntime": "V1alpha1ClusterServingRuntime",
    "InferenceService": "V1beta1InferenceService",
}
SCALARS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "object": (object,),
    "datetime": (str,),
}


def model(name: str) -> Any:
    return getattr(kserve.models, name, None) or getattr(kubernetes.client.models, name, None)


def check(value: Any, kind: str, path: str) -> list[str]:
    kind = kind.strip()
    if m := re.fullmatch(r"(?:list|List)\[(.+)\]", kind):
        if not isinstance(value, list):
            return [f"{path}: a list expected, got {value!r}"]
        return [p for i, v in enumerate(value) for p in check(v, m.group(1), f"{path}[{i}]")]
    if m := re.fullmatch(r"(?:dict\(str, (.+)\)|Dict\[str, (.+)\])", kind):
        if not isinstance(value, dict):
            return [f"{path}: a mapping expected, got {value!r}"]
        inner = m.group(1) or m.group(2)
        return [p for k, v in value.items() for p in check(v, inner, f"{path}.{k}")]
    if kind in SCALARS:
        ok = isinstance(value, SCALARS[kind]) and not (kind in ("int", "float") and isinstance(value, bool))
        return [] if ok else [f"{path}: {kind} expected, got {value!r}"]
    cls = model(kind)
    if cls is None:  # e.g. an int-or-string quantity
        return []
    if not isinstance(value, dict):
        return [f"{path}: a {kind} mapping expected, got {value!r}"]
    fields = {key: attr for attr, key in cls.attribute_map.items()}
    problems = [f"{path}.{k}: no such field in {kind}" for k in value if k not in fields]
    for key, v in value.items():
        if key in fields:
            problems += check(v, cls.openapi_types[fields[key]], f"{path}.{key}")
    if not problems and hasattr(cls, "from_dict") and cls.__module__.startswith("kubernetes."):
        try:
            cls.from_dict(value)
        except Exception as exc:  # a required field missing, a bad enum
            problems.append(f"{path}: {kind}: {exc}".splitlines()[0])
    return problems


def main(paths: list[str]) -> None:
    result: dict[str, str] = {}
    for path in paths:
        with open(path) as f:
            doc = yaml.safe_load(f)
        problems = check(doc, KINDS[doc["kind"]], doc["kind"])
        result[path] = "ok" if not problems else "; ".join(problems)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
