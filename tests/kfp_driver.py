"""How the KFP 2.17 backend resolves a compiled pipeline, as a checker for our compiled YAML.

``kfp.local`` resolves inputs more loosely than the cluster, so a DAG that runs locally can still
stop in the driver. These rules are read from kubeflow/pipelines at tag 2.17.0:

- ``backend/src/v2/driver/resolve.go`` ``resolveInputParameter``: a ``componentInputParameter``
  is looked up only among the enclosing DAG's inputs ("parent DAG does not have input parameter");
  ``resolveInputArtifact`` likewise for ``componentInputArtifact``; task outputs must come from a
  task of the same DAG that declares that output.
- ``resolveInputs``: a non-optional input without a default must get a value ("neither value nor
  default value provided for non-optional parameter"); a loop's item input is given by the
  iteration, its items by the iterator task's own inputs.
- ``driver.go`` ``getPodResource`` / accelerator: pod-spec placeholders (image, cpu, memory,
  accelerator type and count) name an input of the task and are read with ``GetStringValue()``,
  so anything but a STRING parameter resolves to "" (no GPU; a parse error for cpu/memory).
- ``k8s.go``: platform settings' ``componentInputParameter`` resolve against the enclosing DAG's
  inputs; ``nodeSelectorJson`` must be a STRUCT, ``tolerationJson`` a STRUCT or LIST.
"""

from __future__ import annotations

import re

PLACEHOLDER = re.compile(r"\{\{\$\.inputs\.parameters\['(.+?)'\]\}\}")
CONDITION_INPUT = re.compile(r"inputs\.parameter_values\['(.+?)'\]")
QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
POD_FIELDS = (
    "resourceCpuRequest",
    "resourceCpuLimit",
    "resourceMemoryRequest",
    "resourceMemoryLimit",
)
PLATFORM_TYPES = {"nodeSelectorJson": {"STRUCT"}, "tolerationJson": {"STRUCT", "LIST"}}


def _inputs(component: dict) -> tuple[dict, dict]:
    definitions = component.get("inputDefinitions", {})
    return definitions.get("parameters", {}), definitions.get("artifacts", {})


def _outputs(component: dict) -> tuple[dict, dict]:
    definitions = component.get("outputDefinitions", {})
    return definitions.get("parameters", {}), definitions.get("artifacts", {})


def _component_refs(value, found: list[str]) -> list[str]:
    """Every ``componentInputParameter`` below a platform setting, with its field name."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict) and "componentInputParameter" in item:
                found.append((key, item["componentInputParameter"]))
            else:
                _component_refs(item, found)
    elif isinstance(value, list):
        for item in value:
            _component_refs(item, found)
    return found


class Resolver:
    """Walks every DAG of a compiled pipeline the way the 2.17 driver resolves it."""

    def __init__(self, pipeline_spec: dict, platform_spec: dict | None = None):
        self.components = dict(pipeline_spec.get("components", {}))
        self.components["<root>"] = pipeline_spec["root"]
        self.executors = pipeline_spec.get("deploymentSpec", {}).get("executors", {})
        platforms = (platform_spec or {}).get("platforms", {})
        kubernetes = platforms.get("kubernetes", {}).get("deploymentSpec", {})
        self.platform = kubernetes.get("executors", {})
        self.root_types = {
            name: spec["parameterType"] for name, spec in _inputs(pipeline_spec["root"])[0].items()
        }
        self.root_defaults = {
            name: spec.get("defaultValue")
            for name, spec in _inputs(pipeline_spec["root"])[0].items()
        }
        self.problems: list[str] = []

    def check(self) -> list[str]:
        for name, component in self.components.items():
            for task_name, task in component.get("dag", {}).get("tasks", {}).items():
                self._task(name, component, task_name, task)
        return self.problems

    def _fail(self, dag: str, task: str, message: str) -> None:
        self.problems.append(f"{dag}/{task}: {message}")

    def _task(self, dag_name: str, dag: dict, task_name: str, task: dict) -> None:
        params, artifacts = _inputs(dag)
        tasks = dag["dag"]["tasks"]
        component = self.components[task["componentRef"]["name"]]
        given = task.get("inputs", {}).get("parameters", {})
        given_artifacts = task.get("inputs", {}).get("artifacts", {})
        for name, spec in given.items():
            self._parameter(dag_name, task_name, name, spec, params, tasks)
        for name, spec in given_artifacts.items():
            self._artifact(dag_name, task_name, name, spec, artifacts, tasks)
        self._required_inputs(dag_name, task_name, task, component, given, given_artifacts)
        condition = task.get("triggerPolicy", {}).get("condition", "")
        for name in CONDITION_INPUT.findall(condition):
            if name not in given:
                self._fail(dag_name, task_name, f"condition reads {name}, not an input")
        if "executorLabel" in component:
            label = component["executorLabel"]
            self._pod_placeholders(dag_name, task_name, label, given, params)
            self._platform(dag_name, task_name, label, params)

    def _parameter(self, dag_name, task_name, name, spec, params, tasks) -> None:
        if "componentInputParameter" in spec:
            source = spec["componentInputParameter"]
            if source not in params:
                self._fail(
                    dag_name, task_name, f"parent DAG does not have input parameter {source}"
                )
        elif "taskOutputParameter" in spec:
            producer = spec["taskOutputParameter"]["producerTask"]
            key = spec["taskOutputParameter"]["outputParameterKey"]
            if producer not in tasks:
                self._fail(dag_name, task_name, f"{name}: producer task {producer} not in this DAG")
                return
            outputs = _outputs(self.components[tasks[producer]["componentRef"]["name"]])[0]
            if key not in outputs:
                self._fail(dag_name, task_name, f"{name}: {producer} has no output {key}")

    def _artifact(self, dag_name, task_name, name, spec, artifacts, tasks) -> None:
        if "componentInputArtifact" in spec:
            source = spec["componentInputArtifact"]
            if source not in artifacts:
                self._fail(dag_name, task_name, f"parent DAG does not have input artifact {source}")
        elif "taskOutputArtifact" in spec:
            producer = spec["taskOutputArtifact"]["producerTask"]
            key = spec["taskOutputArtifact"]["outputArtifactKey"]
            if producer not in tasks:
                self._fail(dag_name, task_name, f"{name}: producer task {producer} not in this DAG")
                return
            outputs = _outputs(self.components[tasks[producer]["componentRef"]["name"]])[1]
            if key not in outputs:
                self._fail(dag_name, task_name, f"{name}: {producer} has no output artifact {key}")

    def _required_inputs(self, dag_name, task_name, task, component, given, given_artifacts):
        declared, declared_artifacts = _inputs(component)
        iterator = task.get("parameterIterator") or task.get("artifactIterator") or {}
        item = iterator.get("itemInput")
        items = iterator.get("items", {}).get("inputParameter") or iterator.get("items", {}).get(
            "inputArtifact"
        )
        if items and items not in given and items not in given_artifacts:
            self._fail(dag_name, task_name, f"loop items {items} are not an input of the task")
        if item and item not in declared and item not in declared_artifacts:
            self._fail(dag_name, task_name, f"loop item {item} is not declared by the loop DAG")
        for name, spec in declared.items():
            optional = spec.get("isOptional") or "defaultValue" in spec
            if name not in given and name != item and not optional:
                self._fail(
                    dag_name,
                    task_name,
                    f"neither value nor default value provided for non-optional parameter {name}",
                )
        for name, spec in declared_artifacts.items():
            if name not in given_artifacts and name != item and not spec.get("isOptional"):
                self._fail(dag_name, task_name, f"non-optional artifact {name} is not passed")

    def root_type(self, params: dict, name: str) -> str:
        """The type the value has at run time: the pipeline parameter's, as the loop DAGs
        copy it under a ``pipelinechannel--`` name."""
        plain = name.removeprefix("pipelinechannel--")
        return self.root_types.get(plain, params.get(name, {}).get("parameterType", "?"))

    def _pod_placeholders(self, dag_name, task_name, label, given, params) -> None:
        container = self.executors[label].get("container", {})
        resources = container.get("resources", {})
        fields = {"image": container.get("image", "")}
        fields |= {field: resources.get(field, "") for field in POD_FIELDS}
        accelerator = resources.get("accelerator", {})
        fields["acceleratorType"] = accelerator.get("resourceType", "")
        fields["acceleratorCount"] = accelerator.get("resourceCount", "")
        for field, value in fields.items():
            match = PLACEHOLDER.search(value or "")
            if not match:
                continue
            name = match.group(1)
            if name not in given:
                self._fail(dag_name, task_name, f"{field} reads {name}, not an input of the task")
                continue
            source = given[name].get("componentInputParameter", name)
            kind = self.root_type(params, source)
            if kind != "STRING":
                self._fail(
                    dag_name,
                    task_name,
                    f"{field} reads {source} of type {kind}: GetStringValue() gives ''",
                )
                continue
            default = self.root_defaults.get(source.removeprefix("pipelinechannel--"))
            quantity = field != "image" and field != "acceleratorType"
            if quantity and default is not None and not QUANTITY.match(str(default)):
                self._fail(dag_name, task_name, f"{field}: default {default!r} is no quantity")

    def _platform(self, dag_name, task_name, label, params) -> None:
        for field, source in _component_refs(self.platform.get(label, {}), []):
            if source not in params:
                self._fail(
                    dag_name,
                    task_name,
                    f"{field}: parent DAG does not have input parameter {source}",
                )
                continue
            allowed = PLATFORM_TYPES.get(field, {"STRING"})
            kind = self.root_type(params, source)
            if kind not in allowed:
                self._fail(dag_name, task_name, f"{field} reads {source} of type {kind}")


def problems(pipeline_spec: dict, platform_spec: dict | None = None) -> list[str]:
    """Everything the 2.17 driver would stop on (or silently drop) in a compiled pipeline."""
    return Resolver(pipeline_spec, platform_spec).check()
