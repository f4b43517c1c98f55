"""Structural checks over the parsed configuration: the promises of issue 8 that do not need
a provider to verify (versions pinned, inputs typed and described, a private and encrypted
bucket, a least-privilege role, the internal port closed to everything but brokers)."""

import re

import pytest

from conftest import EXAMPLE, MODULE, TEMPLATES, Config, unquote

# The S3 calls felix makes (cold/src/store.rs), and the KMS calls SSE-KMS adds.
FELIX_ACTIONS = {
    "s3:GetObject",
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:ListBucket",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
}
KMS_ACTIONS = {"kms:Decrypt", "kms:GenerateDataKey"}
# Reading the cluster secret at boot (felix-fetch-secret).
SECRET_ACTIONS = {"secretsmanager:GetSecretValue"}
SECRET_ARN = "${aws_secretsmanager_secret.cluster.arn}"

BUCKET_ARN = "${aws_s3_bucket.segments.arn}"
PREFIX_OBJECTS = "${aws_s3_bucket.segments.arn}/${var.object_prefix}/*"


def configs():
    return [pytest.param(MODULE, id="module"), pytest.param(EXAMPLE, id="example")]


def blocks(body, name):
    """Nested blocks `name` of a block body, static and `dynamic` ones (their content)."""
    out = list(body.get(name, []))
    for dyn in body.get("dynamic", []):
        for label, spec in dyn.items():
            if unquote(label) == name:
                out.extend(spec.get("content", []))
    return out


def as_list(value):
    return value if isinstance(value, list) else [value]


# --- versions ------------------------------------------------------------------------------


@pytest.mark.parametrize("directory", configs())
def test_provider_versions_are_pinned(directory):
    config = Config(directory)
    terraform = config.terraform_blocks()
    assert terraform, f"{directory} has no terraform block"
    providers = {}
    for block in terraform:
        assert "required_version" in block, "terraform.required_version missing"
        assert re.search(r"<|~>", unquote(block["required_version"])), "required_version has no upper bound"
        for req in block.get("required_providers", []):
            providers.update({k: v for k, v in req.items() if not k.startswith("__")})
    assert "aws" in providers
    for name, spec in providers.items():
        assert unquote(spec.get("source", "")).startswith("hashicorp/"), f"{name}: source not pinned"
        version = unquote(spec.get("version", ""))
        assert version, f"{name}: no version constraint"
        if directory == EXAMPLE:
            # A root module pins one minor series (patch releases only).
            assert re.fullmatch(r"(~> \d+\.\d+\.\d+|=?\s*\d+\.\d+\.\d+)", version), f"{name}: {version!r} is not pinned"
        else:
            # A reusable module states a bounded range.
            assert re.search(r"<\s*\d|~>", version), f"{name}: {version!r} has no upper bound"


def test_the_example_uses_the_module_by_relative_path(example):
    main = (EXAMPLE / "main.tf").read_text()
    assert 'source = "../../modules/felix-cluster"' in main


# --- inputs and outputs --------------------------------------------------------------------


@pytest.mark.parametrize("directory", configs())
def test_every_variable_is_typed_and_described(directory):
    variables = Config(directory).variables()
    assert variables
    for name, body in variables.items():
        assert "type" in body, f"variable {name} has no type"
        description = unquote(body.get("description", ""))
        assert len(description) >= 10, f"variable {name} has no description"


def test_module_variables_are_validated(module):
    # Booleans and the free-form tag map need no validation; everything else is checked at
    # plan time rather than discovered on a broker that does not start.
    for name, body in module.variables().items():
        if body["type"].removeprefix("${").removesuffix("}") in ("bool", "map(string)"):
            continue
        assert body.get("validation"), f"variable {name} has no validation"


@pytest.mark.parametrize("directory", configs())
def test_every_output_is_described(directory):
    for name, body in Config(directory).outputs().items():
        assert unquote(body.get("description", "")), f"output {name} has no description"


def test_the_module_outputs_bootstrap_addresses(module):
    outputs = module.outputs()
    for name in ("cluster", "quic_addresses", "kafka_bootstrap_servers", "nlb_quic_address", "nlb_kafka_bootstrap", "metrics_targets"):
        assert name in outputs


# --- the bucket ----------------------------------------------------------------------------


def test_bucket_blocks_public_access(module):
    pab = module.resources("aws_s3_bucket_public_access_block")["segments"]
    assert pab["bucket"] == "${aws_s3_bucket.segments.id}"
    for flag in ("block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets"):
        assert pab[flag] is True, flag
    ownership = module.resources("aws_s3_bucket_ownership_controls")["segments"]
    assert unquote(ownership["rule"][0]["object_ownership"]) == "BucketOwnerEnforced"


def test_bucket_is_encrypted(module):
    sse = module.resources("aws_s3_bucket_server_side_encryption_configuration")["segments"]
    assert sse["bucket"] == "${aws_s3_bucket.segments.id}"
    default = sse["rule"][0]["apply_server_side_encryption_by_default"][0]
    assert "AES256" in default["sse_algorithm"] and "aws:kms" in default["sse_algorithm"]


def test_bucket_refuses_plain_http(module):
    policy = module.data("aws_iam_policy_document")["segments_bucket"]
    (stmt,) = policy["statement"]
    assert unquote(stmt["effect"]) == "Deny"
    cond = stmt["condition"][0]
    assert unquote(cond["variable"]) == "aws:SecureTransport" and cond["values"] == ['"false"']


def test_lifecycle_only_aborts_multipart_uploads_and_never_expires_current_objects(module):
    lifecycle = module.resources("aws_s3_bucket_lifecycle_configuration")["segments"]
    assert "dynamic" not in lifecycle, "rules are written out, not generated"
    (rule,) = lifecycle["rule"]
    # An expiration or transition would take away objects the manifest still names.
    settings = {k for k in rule if not k.startswith("__")} - {"id", "status", "filter"}
    assert settings == {"abort_incomplete_multipart_upload", "dynamic"}, settings
    assert rule["abort_incomplete_multipart_upload"][0]["days_after_initiation"] == 1
    # Only old versions of objects expire, and only when versioning is turned on.
    (dynamic,) = rule["dynamic"]
    (label,) = [unquote(k) for k in dynamic]
    assert label == "noncurrent_version_expiration"
    assert dynamic['"noncurrent_version_expiration"']["for_each"].startswith("${var.bucket_versioning ?")


# --- the role ------------------------------------------------------------------------------


def test_iam_policy_names_only_the_bucket_prefix_and_no_wildcard_actions(module):
    policy = module.data("aws_iam_policy_document")["broker"]
    statements = blocks(policy, "statement")
    seen_actions = set()
    for stmt in statements:
        assert unquote(stmt.get("effect", '"Allow"')) == "Allow"
        assert "not_actions" not in stmt and "not_resources" not in stmt
        actions = {unquote(a) for a in stmt["actions"]}
        seen_actions |= actions
        for action in actions:
            assert "*" not in action, f"wildcard action {action}"
            assert action in FELIX_ACTIONS | KMS_ACTIONS | SECRET_ACTIONS, f"action {action} is not one felix uses"
        resources = [unquote(r) for r in as_list(stmt["resources"])]
        sid = unquote(stmt["sid"])
        if sid == "SegmentObjects":
            assert resources == [PREFIX_OBJECTS]
        elif sid == "ListSegmentPrefix":
            assert actions == {"s3:ListBucket"} and resources == [BUCKET_ARN]
            (cond,) = stmt["condition"]
            assert unquote(cond["variable"]) == "s3:prefix"
            assert [unquote(v) for v in cond["values"]] == ["${var.object_prefix}/*"]
        elif sid == "BootObjects":
            assert actions == {"s3:GetObject"} and resources == ["${local.boot_object_arns}"]
        elif sid == "ClusterSecret":
            # Exactly this module's secret, by its ARN: no wildcard, no other secret.
            assert actions == SECRET_ACTIONS and resources == [SECRET_ARN]
        elif sid == "SegmentBucketKey":
            assert actions == KMS_ACTIONS and resources == ["${statement.value}"]
        else:
            pytest.fail(f"unexpected statement {sid}")
    assert FELIX_ACTIONS | SECRET_ACTIONS <= seen_actions
    # No other statement may name a secret.
    for stmt in statements:
        if unquote(stmt["sid"]) != "ClusterSecret":
            assert not any(unquote(a).startswith("secretsmanager:") for a in stmt["actions"])

    # The boot objects are exact object ARNs built from the operator's s3:// URLs.
    boot = module.locals()["boot_object_arns"]
    assert boot.startswith("${[for u in local.boot_objects : \"arn:") and "*" not in boot


def test_the_role_has_one_inline_policy_and_no_access_keys(module):
    assert set(module.resources("aws_iam_role_policy")) == {"broker"}
    assert module.resources("aws_iam_role_policy")["broker"]["policy"] == "${data.aws_iam_policy_document.broker.json}"
    types = module.all_resource_types()
    assert "aws_iam_access_key" not in types and "aws_iam_user" not in types
    assert "aws_iam_policy" not in types
    # Only AWS's Session Manager policy can be attached, and only on request.
    (ssm,) = module.resources("aws_iam_role_policy_attachment").values()
    assert ssm["count"] == "${var.enable_ssm_session_manager ? 1 : 0}"
    assert ssm["policy_arn"].endswith(':iam::aws:policy/AmazonSSMManagedInstanceCore"')
    for template in TEMPLATES.iterdir():
        text = template.read_text()
        assert "AWS_SECRET_ACCESS_KEY" not in text and "AKIA" not in text, template.name


# --- the network ---------------------------------------------------------------------------


def port_default(module, ref):
    name = ref.removeprefix("${var.").removesuffix("}")
    return module.variables()[name]["default"]


def test_internal_port_is_open_only_between_brokers(module):
    # No inline rules or legacy rule resources that could open ports unseen by this test.
    sg = module.resources("aws_security_group")["broker"]
    assert "ingress" not in sg and "egress" not in sg
    assert "aws_security_group_rule" not in module.all_resource_types()

    internal = port_default(module, "${var.internal_port}")
    for kind in ("aws_vpc_security_group_ingress_rule", "aws_vpc_security_group_egress_rule"):
        for name, rule in module.resources(kind).items():
            assert rule["security_group_id"] == "${aws_security_group.broker.id}"
            assert unquote(rule["description"]), f"{kind}.{name} has no description"
            assert unquote(rule["ip_protocol"]) in ("tcp", "udp"), f"{kind}.{name} opens all protocols"
            low = port_default(module, rule["from_port"]) if isinstance(rule["from_port"], str) else rule["from_port"]
            high = port_default(module, rule["to_port"]) if isinstance(rule["to_port"], str) else rule["to_port"]
            if low <= internal <= high:
                assert rule["from_port"] == rule["to_port"] == "${var.internal_port}", f"{kind}.{name} overlaps the internal port"
                assert rule["referenced_security_group_id"] == "${aws_security_group.broker.id}", f"{kind}.{name}"
                assert "cidr_ipv4" not in rule and "cidr_ipv6" not in rule and "prefix_list_id" not in rule


def test_clients_get_quic_and_kafka_and_monitoring_gets_admin(module):
    ingress = module.resources("aws_vpc_security_group_ingress_rule")
    assert unquote(ingress["quic"]["ip_protocol"]) == "udp" and ingress["quic"]["from_port"] == "${var.quic_port}"
    assert ingress["quic"]["for_each"] == "${toset(var.client_cidrs)}"
    assert unquote(ingress["kafka"]["ip_protocol"]) == "tcp" and ingress["kafka"]["from_port"] == "${var.kafka_port}"
    assert ingress["kafka"]["for_each"] == "${toset(var.client_cidrs)}"
    assert ingress["admin"]["from_port"] == "${var.admin_port}"
    assert ingress["admin"]["for_each"] == "${toset(var.monitoring_cidrs)}"
    # Health checks reach admin only from the load balancer's subnets, only with one.
    assert ingress["admin_health_check"]["for_each"] == "${{for i, cidr in local.nlb_health_check_cidrs : tostring(i) => cidr}}"
    assert module.locals()["nlb_health_check_cidrs"].startswith("${!var.enable_nlb ? [] :")
    assert "var.enable_nlb" in module.data("aws_subnet")["nlb"]["for_each"]
    defaults = {p: port_default(module, f"${{var.{p}}}") for p in ("quic_port", "kafka_port", "internal_port", "admin_port")}
    assert defaults == {"quic_port": 5000, "kafka_port": 9092, "internal_port": 5100, "admin_port": 8080}


def test_brokers_have_no_public_address_and_use_imdsv2(module):
    broker = module.resources("aws_instance")["broker"]
    assert broker["associate_public_ip_address"] is False
    assert unquote(broker["metadata_options"][0]["http_tokens"]) == "required"
    assert broker["root_block_device"][0]["encrypted"] is True
    assert broker["private_ip"] == "${local.brokers[count.index].private_ip}"
    # A user_data change must never stop/start (and so wipe) every broker at once.
    assert broker["user_data_replace_on_change"] is False
    assert broker["lifecycle"][0]["ignore_changes"] == ["ami", "user_data"]


def test_broker_addresses_come_from_subnet_cidrs_not_from_lookups(module):
    # Known at plan time: computed with cidrhost from the CIDRs the caller passes in.
    brokers = module.locals()["brokers"]
    assert "cidrhost(var.subnets[i % local.subnet_count].cidr_block, var.broker_host_number + floor(i / local.subnet_count))" in brokers
    assert module.locals()["cluster"] == '${join(",", [for m in local.cluster_members : "${m.id}=${m.address}"])}'


# --- the cluster secret --------------------------------------------------------------------


def test_the_cluster_secret_is_generated_once_stored_encrypted_and_passed_to_the_brokers(module):
    (password,) = module.resources("random_password").values()
    assert password["length"] >= 32, "felix refuses secrets under 32 bytes"
    assert password["special"] is False
    secrets = module.resources("aws_secretsmanager_secret")
    assert set(secrets) == {"cluster"}
    secret = secrets["cluster"]
    # Secrets Manager encrypts every secret; with kms_key_arn, under the operator's key.
    assert secret["kms_key_id"] == "${var.kms_key_arn}"
    assert secret["recovery_window_in_days"] >= 7
    version = module.resources("aws_secretsmanager_secret_version")["cluster"]
    assert version["secret_id"] == "${aws_secretsmanager_secret.cluster.id}"
    assert version["secret_string"] == "${random_password.cluster_secret.result}"
    # No resource policy opens it to anyone else; only the broker role reads it.
    assert "aws_secretsmanager_secret_policy" not in module.all_resource_types()
    # Brokers boot after the secret exists, fetch it by ARN, and felix is started with it.
    broker = module.resources("aws_instance")["broker"]
    assert broker["depends_on"] == ["${aws_secretsmanager_secret_version.cluster}"]
    assert "cluster_secret_arn = aws_secretsmanager_secret.cluster.arn" in module.locals()["user_data"]
    unit = (TEMPLATES / "felix.service.tftpl").read_text()
    assert "--cluster-secret-file /etc/felix/cluster.secret" in unit
    assert "Environment=FELIX_AUTH=on" in unit
    assert "${cluster_secret_arn}" in (TEMPLATES / "user-data.yaml.tftpl").read_text()
    # The secret's value never reaches user data or a template.
    for template in TEMPLATES.iterdir():
        assert "random_password" not in template.read_text(), template.name
    assert "random_password" not in module.locals()["user_data"]
