"""`kubectl auth can-i VERB RESOURCE --as system:serviceaccount:NS:SA -n NS`, answered offline
for each rendered overlay: KFP's pipeline service account can do what the train task does with
train_backend=trainjob (the kubeflow SDK 0.5.0 TrainerClient on Kubeflow Trainer v2.3.0), and
nothing this project did not mean to grant.

The answers come from Kubernetes' RBAC authorizer, re-implemented here as it reads upstream:
- pkg/apis/rbac/v1/evaluation_helpers.go: VerbMatches, APIGroupMatches, ResourceMatches
  ("*", "resource/subresource", "*/subresource"), ResourceNameMatches (empty = every name);
- plugin/pkg/auth/authorizer/rbac/rbac.go: RuleAllows (resource + "/" + subresource);
- pkg/registry/rbac/validation/rule.go: VisitRulesFor (ClusterRoleBindings everywhere,
  RoleBindings only in the request's namespace, a RoleBinding's roleRef a Role there or a
  ClusterRole) and appliesToUser (User, Group, ServiceAccount, whose empty namespace means the
  binding's namespace);
- pkg/controller/clusterroleaggregation/clusterroleaggregation_controller.go: an aggregated
  ClusterRole's rules are those of every other ClusterRole a clusterRoleSelector matches;
- kubectl auth can-i: a cluster-scoped resource is asked about with no namespace.
A service account's user is system:serviceaccount:NS:SA in groups system:serviceaccounts,
system:serviceaccounts:NS and system:authenticated.

What each mode's cluster holds besides grail's rendered objects:
- standalone: Trainer's own install (manifests/overlays/manager) binds nothing for users but the
  kubeflow-trainer-public ConfigMap (manifests/base/rbac/public_configmap_role*.yaml);
- multi-user: Trainer's kubeflow-platform overlay (tests/kubeflow_trainer/v2.3.0/
  kubeflow-trainer-roles.yaml, and the same ConfigMap role in `kubeflow`), Kubeflow's aggregated
  kubeflow-edit ClusterRole and the profile controller's RoleBinding default-editor. The real
  kubeflow-edit aggregates more (Kubeflow's kubeflow-kubernetes-edit lets default-editor create
  pods, read secrets, ...): in that mode the denials below say what grail and Trainer add.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import yaml
from k8s_overlays import NAMESPACES, OVERLAYS, RUNNERS, mode, objects, render
from trainer_schemas import VENDORED

TRAINER = "trainer.kubeflow.org"
KUBEFLOW_EDIT = "rbac.authorization.kubeflow.org/aggregate-to-kubeflow-edit"
CLUSTER_SCOPED = {"clustertrainingruntimes", "clusterroles", "namespaces", "nodes"}
SYSTEM_NAMESPACES = {"standalone": "kubeflow-system", "multi-user": "kubeflow"}
PUBLIC_CONFIGMAP = "kubeflow-trainer-public"


@dataclass(frozen=True)
class Ask:
    """kubectl auth can-i VERB RESOURCE[.GROUP][/NAME] [--subresource=S] [-n NAMESPACE]"""

    verb: str
    resource: str  # "pods", "trainjobs.trainer.kubeflow.org", "configmaps/NAME"
    subresource: str = ""
    namespace: str | None = None  # None: the service account's own

    def __str__(self) -> str:
        sub = f" --subresource={self.subresource}" if self.subresource else ""
        return f"{self.verb} {self.resource}{sub} -n {self.namespace or '<own>'}"


# What the SDK calls (kubeflow/trainer/backends/kubernetes/backend.py): get_runtime GETs a
# namespaced TrainingRuntime first (any error but 404 is fatal), then the ClusterTrainingRuntime;
# train() creates the TrainJob; get_job/list_jobs/wait_for_job_status read it; delete_job deletes
# it; get_job_logs lists its pods and follows pods/log; get_job_events lists events; the client
# reads the kubeflow-trainer-public ConfigMap once (a warning if it cannot).
NEEDED = [
    *(Ask(v, f"trainjobs.{TRAINER}") for v in ("create", "get", "list", "watch", "delete")),
    *(Ask(v, f"trainingruntimes.{TRAINER}") for v in ("get", "list", "watch")),
    *(Ask(v, f"clustertrainingruntimes.{TRAINER}") for v in ("get", "list", "watch")),
    *(Ask(v, r) for v in ("get", "list", "watch") for r in ("pods", "events")),
    Ask("get", "pods", subresource="log"),
]
NOT_NEEDED = [
    Ask("create", "pods"),
    Ask("delete", "pods"),
    Ask("create", "pods", subresource="exec"),
    Ask("get", "secrets"),
    Ask("list", "configmaps"),
    Ask("update", f"trainjobs.{TRAINER}"),
    Ask("create", f"trainjobs.{TRAINER}", namespace="default"),
    Ask("get", "pods", subresource="log", namespace="default"),
    Ask("create", f"trainingruntimes.{TRAINER}"),
    *(Ask(v, f"clustertrainingruntimes.{TRAINER}") for v in ("create", "update", "delete")),
    Ask("create", "rolebindings.rbac.authorization.k8s.io"),
]


def _service_account(namespace: str, name: str) -> tuple[str, set[str]]:
    groups = {"system:serviceaccounts", f"system:serviceaccounts:{namespace}"}
    return f"system:serviceaccount:{namespace}:{name}", groups | {"system:authenticated"}


def _rule_allows(rule: dict, verb: str, group: str, resource: str, sub: str, name: str) -> bool:
    """evaluation_helpers.go, as rbac.go's RuleAllows combines it for a resource request."""
    combined = f"{resource}/{sub}" if sub else resource
    resources = rule.get("resources", [])
    return (
        bool({"*", verb} & set(rule.get("verbs", [])))
        and bool({"*", group} & set(rule.get("apiGroups", [])))
        and (
            bool({"*", combined} & set(resources))
            or bool(sub and f"*/{sub}" in resources)  # "*/log": that subresource of anything
        )
        and (not rule.get("resourceNames") or name in rule["resourceNames"])
    )


def _selects(selector: dict, labels: dict) -> bool:
    """metav1.LabelSelectorAsSelector: matchLabels and matchExpressions, all of them."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, values = expression["key"], expression.get("values", [])
        present, value = key in labels, labels.get(key)
        holds = {
            "In": present and value in values,
            "NotIn": not present or value not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[expression["operator"]]
        if not holds:
            return False
    return True


def _aggregated(cluster_roles: dict[str, dict]) -> dict[str, list[dict]]:
    """ClusterRole name -> rules, once the aggregation controller has settled."""
    rules = {name: list(role.get("rules") or []) for name, role in cluster_roles.items()}
    changed = True
    while changed:
        changed = False
        for name, role in sorted(cluster_roles.items()):
            selectors = (role.get("aggregationRule") or {}).get("clusterRoleSelectors")
            if not selectors:
                continue
            union = []
            for other, other_role in sorted(cluster_roles.items()):
                labels = other_role["metadata"].get("labels", {})
                if other != name and any(_selects(s, labels) for s in selectors):
                    union += [r for r in rules[other] if r not in union]
            if union != rules[name]:
                rules[name], changed = union, True
    return rules


def _applies(subject: dict, user: str, groups: set[str], binding_namespace: str) -> bool:
    """rule.go appliesToUser."""
    if subject["kind"] == "User":
        return subject["name"] == user
    if subject["kind"] == "Group":
        return subject["name"] in groups
    if subject["kind"] == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return bool(namespace) and user == f"system:serviceaccount:{namespace}:{subject['name']}"
    return False


def _split(resource: str) -> tuple[str, str, str]:
    """kubectl's RESOURCE[.GROUP][/NAME] -> (group, resource, name)."""
    resource, _, name = resource.partition("/")
    resource, _, group = resource.partition(".")
    return group, resource, name


def can_i(cluster: list[dict], ask: Ask, namespace: str, account: str) -> bool:
    """`kubectl auth can-i` for the service account `account` of `namespace` (rbac.go Authorize:
    allowed as soon as a rule of a binding that applies allows the request)."""
    user, groups = _service_account(namespace, account)
    group, resource, name = _split(ask.resource)
    where = "" if resource in CLUSTER_SCOPED else (ask.namespace or namespace)
    cluster_roles = {o["metadata"]["name"]: o for o in cluster if o["kind"] == "ClusterRole"}
    cluster_rules = _aggregated(cluster_roles)
    roles = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o.get("rules") or []
        for o in cluster
        if o["kind"] == "Role"
    }
    for binding in cluster:
        if binding["kind"] == "ClusterRoleBinding":
            binding_namespace = ""
        elif binding["kind"] == "RoleBinding" and where == binding["metadata"]["namespace"]:
            binding_namespace = where
        else:
            continue
        if not any(_applies(s, user, groups, binding_namespace) for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        if ref["kind"] == "ClusterRole":
            rules = cluster_rules.get(ref["name"], [])
        else:
            rules = roles.get((binding_namespace, ref["name"]), [])
        if any(_rule_allows(r, ask.verb, group, resource, ask.subresource, name) for r in rules):
            return True
    return False


def _public_configmap_rbac(namespace: str) -> list[dict]:
    """Trainer's manifests/base/rbac/public_configmap_role.yaml and its binding."""
    name = PUBLIC_CONFIGMAP
    meta = {"name": name, "namespace": namespace}
    rule = {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [name]}
    everyone = {"kind": "Group", "name": "system:authenticated"}
    return [
        {"kind": "Role", "metadata": meta, "rules": [rule | {"verbs": ["get", "list", "watch"]}]},
        {
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"kind": "Role", "name": name},
            "subjects": [everyone],
        },
    ]


def _kubeflow_profile(namespace: str) -> list[dict]:
    """Kubeflow's aggregated kubeflow-edit and the profile controller's binding of it."""
    kubeflow_edit = {
        "kind": "ClusterRole",
        "metadata": {"name": "kubeflow-edit"},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {KUBEFLOW_EDIT: "true"}}]},
        "rules": [],
    }
    binding = {
        "kind": "RoleBinding",
        "metadata": {"name": "default-editor", "namespace": namespace},
        "roleRef": {"kind": "ClusterRole", "name": "kubeflow-edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "default-editor", "namespace": namespace}],
    }
    return [kubeflow_edit, binding]


def _cluster(overlay_objects: list[dict], install: str) -> list[dict]:
    """What the cluster holds once grail's overlay for the `install` mode sits next to Trainer."""
    trainer = _public_configmap_rbac(SYSTEM_NAMESPACES[install])
    if install == "multi-user":
        platform = (VENDORED / "kubeflow-trainer-roles.yaml").read_text()
        trainer += [o for o in yaml.safe_load_all(platform) if o]
        trainer += _kubeflow_profile(NAMESPACES[install])
    return overlay_objects + trainer


@pytest.fixture(scope="module")
def clusters(tmp_path_factory) -> dict[str, list[dict]]:
    rendered = render(tmp_path_factory.mktemp("k8s"))
    return {overlay: _cluster(objects(path), mode(overlay)) for overlay, path in rendered.items()}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pipeline_account_can_do_what_the_train_task_does(clusters, overlay):
    namespace, account = NAMESPACES[mode(overlay)], RUNNERS[mode(overlay)]
    denied = [str(a) for a in NEEDED if not can_i(clusters[overlay], a, namespace, account)]
    assert not denied, f"{account} in {namespace} may not: {denied}"
    public = Ask(
        "get", f"configmaps/{PUBLIC_CONFIGMAP}", namespace=SYSTEM_NAMESPACES[mode(overlay)]
    )
    assert can_i(clusters[overlay], public, namespace, account)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_it_can_do_nothing_the_train_task_does_not(clusters, overlay):
    namespace, account = NAMESPACES[mode(overlay)], RUNNERS[mode(overlay)]
    allowed = [str(a) for a in NOT_NEEDED if can_i(clusters[overlay], a, namespace, account)]
    assert not allowed, f"{account} in {namespace} may also: {allowed}"
    other = Ask("get", "configmaps/other", namespace=SYSTEM_NAMESPACES[mode(overlay)])
    assert not can_i(clusters[overlay], other, namespace, account)
    # Another service account of the same namespace gets none of it.
    assert not can_i(clusters[overlay], NEEDED[0], namespace, "default")


def _without(cluster: list[dict], kind: str, name: str) -> list[dict]:
    kept = [o for o in cluster if (o["kind"], o["metadata"]["name"]) != (kind, name)]
    assert len(kept) == len(cluster) - 1, f"no {kind} {name}"
    return kept


def test_a_missing_grant_is_denied(clusters):
    """The checks can fail: without grail's ClusterRoleBinding, standalone Trainer lets nobody
    read ClusterTrainingRuntimes; without pods/log in grail's Role, logs are denied; without its
    aggregation label, Kubeflow's kubeflow-edit grants no TrainJobs."""
    standalone = clusters["gke-h100-standalone"]
    namespace = NAMESPACES["standalone"]
    runtime = Ask("get", f"clustertrainingruntimes.{TRAINER}")
    assert can_i(standalone, runtime, namespace, "pipeline-runner")
    unbound = _without(standalone, "ClusterRoleBinding", "grail-read-clustertrainingruntimes")
    assert not can_i(unbound, runtime, namespace, "pipeline-runner")

    logs = Ask("get", "pods", subresource="log")
    no_logs = copy.deepcopy(standalone)
    role = next(
        o for o in no_logs if o["kind"] == "Role" and o["metadata"]["name"] == "grail-trainjobs"
    )
    for rule in role["rules"]:
        rule["resources"] = [r for r in rule["resources"] if r != "pods/log"]
    assert not can_i(no_logs, logs, namespace, "pipeline-runner")
    assert can_i(no_logs, Ask("get", "pods"), namespace, "pipeline-runner")

    multi_user = copy.deepcopy(clusters["gke-h100-multi-user"])
    edit = next(o for o in multi_user if o["metadata"]["name"] == "kubeflow-trainer-edit")
    del edit["metadata"]["labels"][KUBEFLOW_EDIT]
    create = Ask("create", f"trainjobs.{TRAINER}")
    assert not can_i(multi_user, create, NAMESPACES["multi-user"], "default-editor")


def _rule(*resources: str, verbs=("get",), groups=("",), names=()) -> dict:
    rule = {"verbs": list(verbs), "apiGroups": list(groups), "resources": list(resources)}
    return rule | ({"resourceNames": list(names)} if names else {})


@pytest.mark.parametrize(
    ("rule", "ask", "allowed"),
    [
        (_rule("pods", verbs=["*"]), Ask("delete", "pods"), True),
        (_rule("pods"), Ask("list", "pods"), False),
        # "pods" does not grant its subresources; "pods/log" and "*/log" do.
        (_rule("pods"), Ask("get", "pods", "log"), False),
        (_rule("pods/log"), Ask("get", "pods", "log"), True),
        (_rule("*/log"), Ask("get", "pods", "log"), True),
        (_rule("*/log"), Ask("get", "pods"), False),
        (_rule("*"), Ask("get", "pods", "exec"), True),
        # the group must match: core "" is not trainer.kubeflow.org; "*" is every group
        (_rule("trainjobs"), Ask("get", f"trainjobs.{TRAINER}"), False),
        (_rule("trainjobs", groups=["*"]), Ask("get", f"trainjobs.{TRAINER}"), True),
        # resourceNames: those names only; a request without a name (list) matches none
        (_rule("configmaps", names=["a"]), Ask("get", "configmaps/a"), True),
        (_rule("configmaps", names=["a"]), Ask("get", "configmaps/b"), False),
        (_rule("configmaps", verbs=["list"], names=["a"]), Ask("list", "configmaps"), False),
    ],
)
def test_rules_match_as_kubernetes_matches_them(rule, ask, allowed):
    group, resource, name = _split(ask.resource)
    assert _rule_allows(rule, ask.verb, group, resource, ask.subresource, name) is allowed


def test_bindings_and_aggregation_reach_whom_kubernetes_says():
    rule = _rule("pods")
    cluster = [
        {
            "kind": "ClusterRole",
            "metadata": {"name": "leaf", "labels": {"agg": "mid"}},
            "rules": [rule],
        },
        {
            "kind": "ClusterRole",
            "metadata": {"name": "mid", "labels": {"agg": "top"}},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"agg": "mid"}}]},
        },
        {
            "kind": "ClusterRole",
            "metadata": {"name": "top"},
            "aggregationRule": {
                "clusterRoleSelectors": [
                    {"matchExpressions": [{"key": "agg", "operator": "In", "values": ["top"]}]}
                ]
            },
        },
        # No namespace on the subject: the RoleBinding's own namespace.
        {
            "kind": "RoleBinding",
            "metadata": {"name": "b", "namespace": "ns"},
            "roleRef": {"kind": "ClusterRole", "name": "top"},
            "subjects": [{"kind": "ServiceAccount", "name": "sa"}],
        },
    ]
    assert can_i(cluster, Ask("get", "pods"), "ns", "sa")  # leaf -> mid -> top, bound in ns
    assert not can_i(cluster, Ask("get", "pods", namespace="other"), "ns", "sa")
    assert not can_i(cluster, Ask("get", "pods"), "other", "sa")  # the same name elsewhere
    # In a ClusterRoleBinding, a service account subject needs its namespace.
    cluster[-1] = cluster[-1] | {"kind": "ClusterRoleBinding"}
    assert not can_i(cluster, Ask("get", "pods"), "ns", "sa")
