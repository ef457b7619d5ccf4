"""trainer_schemas.validate against the vendored Kubeflow Trainer v2.3.0 CRDs: Trainer's own
torch-distributed runtime and a TrainJob shaped like grail's validate; the mistakes a TrainJob body
can carry are refused with their path named.

    .venv/bin/python -m pytest tests/test_trainer_schemas.py -q
"""

from __future__ import annotations

import re

import pytest
import trainer_schemas
import yaml


def _torch_distributed() -> dict:
    return yaml.safe_load((trainer_schemas.VENDORED / "torch_distributed.yaml").read_text())


def _trainjob() -> dict:
    """What grail's train task asks for with train_backend=trainjob: 2 nodes of 8 GPUs."""
    node_pod = {
        "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        "tolerations": [
            {
                "key": "nvidia.com/gpu",
                "operator": "Equal",
                "value": "present",
                "effect": "NoSchedule",
            }
        ],
    }
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "grail-train-3f2a9c",
            "namespace": "kubeflow",
            "labels": {"app.kubernetes.io/part-of": "grail"},
        },
        "spec": {
            "runtimeRef": {
                "name": "torch-distributed",
                "kind": "ClusterTrainingRuntime",
                "apiGroup": "trainer.kubeflow.org",
            },
            "trainer": {
                "image": "ghcr.io/grail-pipeline/grail:0.1.0",
                "command": ["grail", "train"],
                "args": ["--config", "/recipes/config_grpo.yaml"],
                "env": [
                    {"name": "MLFLOW_RUN_ID", "value": "0a1b2c"},
                    {
                        "name": "MLFLOW_TRACKING_URI",
                        "valueFrom": {
                            "secretKeyRef": {"name": "grail-mlflow", "key": "MLFLOW_TRACKING_URI"}
                        },
                    },
                ],
                "numNodes": 2,
                "resourcesPerNode": {
                    "limits": {"nvidia.com/gpu": 8},
                    "requests": {"cpu": "8", "memory": "64Gi"},
                },
            },
            "runtimePatches": [
                {
                    "manager": "grail",
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": "node",
                                        "template": {"spec": {"template": {"spec": node_pod}}},
                                    }
                                ]
                            }
                        }
                    },
                }
            ],
        },
    }


def test_trainers_torch_distributed_runtime_validates():
    runtime = _torch_distributed()
    assert runtime["kind"] == "ClusterTrainingRuntime"
    trainer_schemas.validate(runtime)


def test_a_trainjob_like_grails_validates():
    trainer_schemas.validate(_trainjob())


def test_quantities_take_integers_and_strings_and_nulls_are_pruned():
    body = _trainjob()
    body["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] = 8
    body["spec"]["activeDeadlineSeconds"] = None  # what a serialiser that keeps None sends
    trainer_schemas.validate(body)


def _set(path: str, value):
    """A mutation setting `value` at a dotted path (None deletes, [i] indexes a list)."""

    def mutate(body: dict) -> None:
        *parents, last = re.findall(r"[^.\[\]]+", path)
        node = body
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is None:
            del node[last]
        else:
            node[last] = value

    return mutate


def _duplicate_env(body: dict) -> None:
    body["spec"]["trainer"]["env"].append({"name": "MLFLOW_RUN_ID", "value": "other"})


@pytest.mark.parametrize(
    ("mutate", "where", "what"),
    [
        (_set("spec.trainer.numProcsPerNode", 8), "spec.trainer.numProcsPerNode", "unknown field"),
        (_set("spec.trainer.numNodes", "2"), "spec.trainer.numNodes", "not of type 'integer'"),
        (_set("spec.runtimeRef.name", None), "spec.runtimeRef.name", "Required value"),
        (_set("spec.runtimeRef", None), "spec.runtimeRef", "Required value"),
        (_set("metadata.uid", "x"), "metadata.uid", "unknown field"),
        (_set("metadata.name", "Grail_Train"), "<root>", "RFC 1035"),
        (_set("spec.trainer.resourcesPerNode.limits.cpu", 1.5), "limits.cpu", "any of the given"),
        (
            _set("spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].x", 1),
            "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].x",
            "unknown field",
        ),
        (_set("spec.managedBy", "grail"), "spec.managedBy", "ManagedBy must be"),
        (_duplicate_env, "spec.trainer.env[2]", "duplicate entry ('MLFLOW_RUN_ID',)"),
        (_set("apiVersion", "trainer.kubeflow.org/v1"), "apiVersion", "not served"),
    ],
)
def test_a_broken_trainjob_is_refused_with_its_path(mutate, where, what):
    body = _trainjob()
    mutate(body)
    with pytest.raises(ValueError, match=re.escape(where)) as refused:
        trainer_schemas.validate(body)
    assert what in str(refused.value).splitlines()[0]


def test_a_runtime_with_two_ml_policies_is_refused():
    runtime = _torch_distributed()
    runtime["spec"]["mlPolicy"]["mpi"] = {}
    with pytest.raises(ValueError, match=r"spec\.mlPolicy: Only one of the policy"):
        trainer_schemas.validate(runtime)


def _cel_rules(schema) -> set[str]:
    if isinstance(schema, list):
        return set().union(*map(_cel_rules, schema))
    if not isinstance(schema, dict):
        return set()
    own = {r["rule"] for r in schema.get("x-kubernetes-validations", [])}
    return own.union(*map(_cel_rules, schema.values()))


def test_every_cel_rule_of_the_crds_is_evaluated_or_a_transition_rule():
    """The loader refuses CEL rules it has no twin for; this lists what is left unevaluated."""
    rules = set()
    for path in trainer_schemas.CRDS.values():
        rules |= _cel_rules(yaml.load(path.read_text(), Loader=yaml.CSafeLoader))
    assert rules - set(trainer_schemas.CEL_RULES) == {"self == oldSelf"}  # checked on update only
    assert set(trainer_schemas.CEL_RULES) <= rules  # no twin of a rule the CRDs dropped
