"""The user data each broker boots with, rendered here as `templatefile` would render it
(tftpl.py), unpacked into a temporary directory that stands in for the instance's file
system and NVMe mount, and judged by the real `felix --check-config`: a key felix does not
know, a malformed cluster list or a bad address in the template fails here, not on a
cluster. Runs without containers, Terraform or AWS."""

import base64
import ipaddress
import os
import re
import stat
import subprocess
import tomllib

import pytest
import yaml

from conftest import EXAMPLE, TEMPLATES, Config, unquote
from tftpl import render_file

BINARY_URL = "s3://felix-artifacts-example/releases/felix-x86_64"
REGION = "eu-west-1"
BUCKET = "felix-demo-segments-20261201000000000000000001"
SECRET_ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:demo-cluster-secret-20261201-AbCdEf"
SECRET_FILE = "/etc/felix/cluster.secret"

# examples/three-az: the VPC CIDR and its private /20s, as its main.tf computes them.
EXAMPLE_VPC = ipaddress.ip_network("10.42.0.0/16")
EXAMPLE_SUBNETS = [
    {"id": f"subnet-0{i}", "cidr_block": str(list(EXAMPLE_VPC.subnets(new_prefix=20))[i]), "availability_zone": f"{REGION}{az}"}
    for i, az in enumerate("abc")
]


def defaults(module):
    return {name: (unquote(body["default"]) if "default" in body else None) for name, body in module.variables().items()}


def brokers(subnets, count, host_number):
    """local.brokers in main.tf."""
    out = []
    for i in range(count):
        subnet = subnets[i % len(subnets)]
        net = ipaddress.ip_network(subnet["cidr_block"])
        out.append(
            {
                "id": i + 1,
                "subnet_id": subnet["id"],
                "availability_zone": subnet["availability_zone"],
                "private_ip": str(net[host_number + i // len(subnets)]),
            }
        )
    return out


def templatefile_keys(expression: str, template: str) -> set[str]:
    """The variable names of the object passed to templatefile(".../templates/<template>", {...})."""
    start = expression.index(f'/templates/{template}", {{') + len(f'/templates/{template}", {{')
    depth, i, keys, token, in_string = 0, start, set(), "", False
    while True:
        c = expression[i]
        if in_string:
            in_string = c != '"' or expression[i - 1] == "\\"
        elif c == '"':
            in_string = True
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and c == ",":
            token = ""
            i += 1
            continue
        if depth == 0 and not in_string and c == "=" and expression[i + 1] != "=" and expression[i - 1] not in "!=<>":
            keys.add(token.strip())
        token += c
        i += 1
    return keys


def render_broker(module, mount, node_id, count=3, subnets=EXAMPLE_SUBNETS, tls=None, **overrides):
    """(user data, felix.toml, felix.service) of broker `node_id`, with the module's defaults."""
    d = defaults(module) | overrides
    bs = brokers(subnets, count, d["broker_host_number"])
    me = bs[node_id - 1]
    members = [{"id": b["id"], "address": f"{b['private_ip']}:{d['internal_port']}"} for b in bs]
    toml_vars = {
        "node_id": me["id"],
        "broker_count": count,
        "availability_zone": me["availability_zone"],
        "cluster_members": members,
        "data_dir": str(mount),
        "quic_port": d["quic_port"],
        "admin_port": d["admin_port"],
        "internal_port": d["internal_port"],
        "kafka_port": d["kafka_port"],
        "object_store": f"s3://{BUCKET}/{d['object_prefix']}",
        "s3_region": REGION,
        "fsync": d["fsync"],
        "cache_disk_bytes": d["cache_disk_bytes"],
        "tls_enabled": tls is not None,
    }
    service_vars = {"data_dir": str(mount), "memory_max": d["memory_max"], "nofile_limit": d["nofile_limit"]}
    felix_toml = render_file(TEMPLATES / "felix.toml.tftpl", toml_vars)
    felix_service = render_file(TEMPLATES / "felix.service.tftpl", service_vars)
    user_data_vars = {
        "node_id": me["id"],
        "data_dir": str(mount),
        "felix_toml_b64": base64.b64encode(felix_toml.encode()).decode(),
        "felix_service_b64": base64.b64encode(felix_service.encode()).decode(),
        "felix_binary_url": BINARY_URL,
        "felix_binary_sha256": "0" * 64,
        "tls_cert_s3_uri": tls[0] if tls else "",
        "tls_key_s3_uri": tls[1] if tls else "",
        "cluster_secret_arn": SECRET_ARN,
        "region": REGION,
    }
    user_data = render_file(TEMPLATES / "user-data.yaml.tftpl", user_data_vars)
    return user_data, toml_vars, service_vars, user_data_vars


def unpack(user_data: str, root):
    """Writes cloud-init's write_files under `root`, as cloud-init would under /."""
    assert user_data.startswith("#cloud-config\n")
    doc = yaml.safe_load(user_data)
    written = {}
    for entry in doc["write_files"]:
        content = entry["content"]
        data = base64.b64decode(content) if entry.get("encoding") == "b64" else content.encode()
        target = root / entry["path"].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(int(entry.get("permissions", "0644"), 8))
        written[entry["path"]] = target
    return doc, written


def service_invocation(unit: str):
    """The arguments after the binary on felix.service's ExecStart line, and its Environment."""
    (exec_start,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    args = exec_start.removeprefix("ExecStart=").split()[1:]
    env = dict(
        pair.split("=", 1)
        for line in unit.splitlines()
        if line.startswith("Environment=")
        for pair in line.removeprefix("Environment=").split()
    )
    return args, env


def check_config(felix_bin, files, cwd):
    """`felix --check-config` invoked as felix.service invokes felix, on the unpacked files."""
    args, service_env = service_invocation(files["/etc/systemd/system/felix.service"].read_text())
    args = [str(files[a]) if a in files else a for a in args]
    # Only the unit and the file may decide: no FELIX_* variable of the caller's environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FELIX_")} | service_env
    return subprocess.run(
        [str(felix_bin), *args, "--check-config"],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
    )


def test_templatefile_variables_match_main_tf(module):
    # The test renders with exactly the variables main.tf passes: a variable added to a
    # template and to main.tf must be added here too (the renderer refuses missing ones).
    local = module.locals()
    _, toml_vars, service_vars, user_data_vars = render_broker(module, "/var/lib/felix", 1)
    assert templatefile_keys(local["felix_toml"], "felix.toml.tftpl") == set(toml_vars)
    assert templatefile_keys(local["felix_service"], "felix.service.tftpl") == set(service_vars)
    assert templatefile_keys(local["user_data"], "user-data.yaml.tftpl") == set(user_data_vars)
    assert local["data_dir"] == '"/var/lib/felix"'


def test_example_subnets_match_the_example(module):
    main = (EXAMPLE / "main.tf").read_text()
    assert "cidrsubnet(var.vpc_cidr, 4, i)" in main
    assert unquote(Config(EXAMPLE).variables()["vpc_cidr"]["default"]) == str(EXAMPLE_VPC)


@pytest.mark.parametrize(
    "count,tls",
    [
        (3, None),
        (5, None),
        (3, ("s3://felix-secrets-example/tls/broker.pem", "s3://felix-secrets-example/tls/broker.key")),
    ],
    ids=["3-brokers", "5-brokers", "3-brokers-tls"],
)
def test_rendered_user_data_gives_a_config_felix_accepts(module, felix_bin, tmp_path, count, tls):
    for node_id in range(1, count + 1):
        root = tmp_path / f"node{node_id}"
        mount = root / "var" / "lib" / "felix"  # stands in for the NVMe mount
        mount.mkdir(parents=True)
        user_data, toml_vars, _, _ = render_broker(module, mount, node_id, count=count, tls=tls)
        _, files = unpack(user_data, root)

        result = check_config(felix_bin, files, root)
        assert result.returncode == 0, f"node {node_id}: felix --check-config refused the rendered config:\n{result.stderr}"
        effective = tomllib.loads(result.stdout)

        assert effective["node_id"] == node_id
        assert effective["zone"] == toml_vars["availability_zone"]
        assert effective["data_dir"] == str(mount)
        assert effective["cache_dir"] == str(mount / "cache")
        assert effective["object_store"] == toml_vars["object_store"]
        assert effective["s3_region"] == REGION
        assert effective["quic_addr"] == "0.0.0.0:5000"
        assert effective["admin_addr"] == "0.0.0.0:8080"
        assert effective["internal_addr"] == "0.0.0.0:5100"
        assert effective["fsync"] == "periodic"
        assert effective["cache_disk_bytes"] == 16 * 1024**3
        # The internal network is authenticated with the secret fetched at boot.
        assert effective["auth"] is True
        assert effective["cluster_secret_file"] == SECRET_FILE
        if tls:
            assert effective["tls_cert"] == "/etc/felix/tls/broker.pem"
            assert effective["tls_key"] == "/etc/felix/tls/broker.key"
        else:
            assert "tls_cert" not in effective
        # Nothing was created: --check-config only validates.
        assert list(mount.iterdir()) == []


def cluster_of(effective) -> dict[int, str]:
    cluster = effective["cluster"]
    if isinstance(cluster, str):
        return {int(k): v for k, v in (m.split("=", 1) for m in cluster.split(","))}
    return {int(k): v for k, v in cluster.items()}


@pytest.mark.parametrize("count", [1, 3, 5])
def test_cluster_list_has_one_entry_per_broker_and_each_node_its_own_id(module, felix_bin, tmp_path, count):
    clusters = []
    for node_id in range(1, count + 1):
        root = tmp_path / f"node{node_id}"
        mount = root / "mnt"
        mount.mkdir(parents=True)
        user_data, _, _, _ = render_broker(module, mount, node_id, count=count)
        _, files = unpack(user_data, root)
        result = check_config(felix_bin, files, root)
        assert result.returncode == 0, result.stderr
        effective = tomllib.loads(result.stdout)
        cluster = cluster_of(effective)
        assert effective["node_id"] == node_id
        assert sorted(cluster) == list(range(1, count + 1))
        assert node_id in cluster
        clusters.append(cluster)

    # Every broker has the same list, addresses are distinct, and broker i sits in subnet
    # i % 3 at host 10 + i // 3.
    assert all(c == clusters[0] for c in clusters)
    addresses = list(clusters[0].values())
    assert len(set(addresses)) == count
    for node_id, address in clusters[0].items():
        ip, port = address.rsplit(":", 1)
        i = node_id - 1
        assert port == "5100"
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(EXAMPLE_SUBNETS[i % 3]["cidr_block"])
        assert int(ip.split(".")[-1]) == 10 + i // 3


def test_systemd_unit_restarts_and_limits_felix(module, tmp_path):
    user_data, _, _, _ = render_broker(module, "/var/lib/felix", 1)
    doc, files = unpack(user_data, tmp_path)
    unit = files["/etc/systemd/system/felix.service"].read_text()
    assert f"ExecStart=/usr/local/bin/felix --config /etc/felix/felix.toml --cluster-secret-file {SECRET_FILE}\n" in unit
    assert "Environment=FELIX_AUTH=on\n" in unit
    assert "ExecStartPre=/usr/bin/mountpoint -q /var/lib/felix\n" in unit
    assert "Restart=always\n" in unit
    assert "RestartPreventExitStatus=2\n" in unit  # invalid configuration: do not flap
    assert "LimitNOFILE=1048576\n" in unit
    assert "MemoryMax=85%\n" in unit
    assert "User=felix\n" in unit and "ReadWritePaths=/var/lib/felix\n" in unit
    prepare = files["/etc/systemd/system/felix-prepare.service"].read_text()
    assert "ExecStart=/usr/local/sbin/felix-prepare-disk /var/lib/felix\n" in prepare
    assert any(u["name"] == "felix" and u["system"] for u in doc["users"] if isinstance(u, dict))
    commands = [" ".join(c) if isinstance(c, list) else c for c in doc["runcmd"]]
    assert any("/usr/local/sbin/felix-install" in c for c in commands)
    fetch = [i for i, c in enumerate(commands) if "/usr/local/sbin/felix-fetch-secret" in c]
    assert fetch and fetch[0] < commands.index("systemctl enable --now felix.service")
    assert "systemctl enable --now felix.service" in commands


def test_user_data_fits_the_ec2_limit(module):
    # EC2 refuses user data over 16 KiB (before base64).
    for count in (3, 9):
        user_data, _, _, _ = render_broker(module, "/var/lib/felix", count, count=count)
        assert len(user_data.encode()) < 16 * 1024


def test_boot_scripts_are_valid_bash(module, tmp_path):
    user_data, _, _, _ = render_broker(module, "/var/lib/felix", 1)
    _, files = unpack(user_data, tmp_path)
    for script in ("/usr/local/sbin/felix-prepare-disk", "/usr/local/sbin/felix-install", "/usr/local/sbin/felix-fetch-secret"):
        path = files[script]
        assert path.read_text().startswith("#!/bin/bash\n") and "set -euo pipefail\n" in path.read_text()
        assert path.stat().st_mode & stat.S_IXUSR
        result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script}: {result.stderr}"


def fake_aws(bin_dir, source):
    """An `aws` on PATH whose `s3 cp URL DEST` copies `source` (no network, no AWS)."""
    aws = bin_dir / "aws"
    aws.write_text(f'#!/bin/bash\nset -e\n[ "$1 $2" = "s3 cp" ] || exit 64\ncp "{source}" "${{@: -1}}"\n')
    aws.chmod(0o755)


def run_install(files, tmp_path, felix_bin, sha):
    env_file = files["/etc/felix/install.env"]
    text = env_file.read_text()
    env_file.write_text(re.sub(r"FELIX_BINARY_SHA256='[0-9a-f]*'", f"FELIX_BINARY_SHA256='{sha}'", text))
    bin_dir = tmp_path / "usr-local-bin"
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    fake_aws(tools, felix_bin)
    env = dict(os.environ)
    env.update(
        PATH=f"{tools}:{env['PATH']}",
        FELIX_INSTALL_ENV=str(env_file),
        FELIX_BIN_DIR=str(bin_dir),
        FELIX_TLS_DIR=str(tmp_path / "tls"),
    )
    result = subprocess.run(
        ["bash", str(files["/usr/local/sbin/felix-install"])], capture_output=True, text=True, env=env, timeout=120
    )
    return result, bin_dir


def sha256_of(path):
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def test_felix_install_puts_a_matching_binary_in_place(module, felix_bin, tmp_path):
    user_data, _, _, _ = render_broker(module, "/var/lib/felix", 1)
    _, files = unpack(user_data, tmp_path)
    result, bin_dir = run_install(files, tmp_path, felix_bin, sha256_of(felix_bin))
    assert result.returncode == 0, result.stderr
    installed = bin_dir / "felix"
    assert sha256_of(installed) == sha256_of(felix_bin)
    assert installed.stat().st_mode & stat.S_IXUSR
    assert [p.name for p in bin_dir.iterdir()] == ["felix"]  # no temporary file left


def test_felix_install_refuses_a_binary_whose_checksum_differs(module, felix_bin, tmp_path):
    user_data, _, _, _ = render_broker(module, "/var/lib/felix", 1)
    _, files = unpack(user_data, tmp_path)
    result, bin_dir = run_install(files, tmp_path, felix_bin, "f" * 64)
    assert result.returncode != 0
    assert "does not match SHA-256" in result.stderr
    assert list(bin_dir.iterdir()) == []  # nothing installed, nothing left behind


def run_fetch_secret(files, tmp_path, secret):
    """felix-fetch-secret with an `aws` that answers get-secret-value with `secret` (only for
    the ARN in install.env) and the output under tmp_path."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    aws = tools / "aws"
    aws.write_text(
        "#!/bin/bash\nset -e\n"
        '[ "$1 $2" = "secretsmanager get-secret-value" ] || exit 64\n'
        f'[[ " $* " == *" --secret-id {SECRET_ARN} "* ]] || exit 65\n'
        f"echo '{secret}'\n"
    )
    aws.chmod(0o755)
    out = tmp_path / "etc-felix" / "cluster.secret"
    env = dict(os.environ)
    env.update(
        PATH=f"{tools}:{env['PATH']}",
        FELIX_INSTALL_ENV=str(files["/etc/felix/install.env"]),
        FELIX_SECRET_FILE=str(out),
        FELIX_SECRET_OWNER="",
    )
    result = subprocess.run(
        ["bash", str(files["/usr/local/sbin/felix-fetch-secret"])], capture_output=True, text=True, env=env, timeout=60
    )
    return result, out


def test_felix_fetch_secret_writes_the_secret_0600_where_the_unit_reads_it(module, tmp_path):
    user_data, _, _, _ = render_broker(module, "/var/lib/felix", 1)
    _, files = unpack(user_data, tmp_path)
    assert f"FELIX_CLUSTER_SECRET_ARN='{SECRET_ARN}'" in files["/etc/felix/install.env"].read_text()
    assert f"out=${{FELIX_SECRET_FILE:-{SECRET_FILE}}}" in files["/usr/local/sbin/felix-fetch-secret"].read_text()
    secret = "A" * 64
    result, out = run_fetch_secret(files, tmp_path, secret)
    assert result.returncode == 0, result.stderr
    assert out.read_text().strip() == secret
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert [p.name for p in out.parent.iterdir()] == ["cluster.secret"]  # no temporary file left


def test_felix_fetch_secret_refuses_a_short_secret_and_writes_nothing(module, tmp_path):
    user_data, _, _, _ = render_broker(module, "/var/lib/felix", 1)
    _, files = unpack(user_data, tmp_path)
    result, out = run_fetch_secret(files, tmp_path, "too-short")
    assert result.returncode != 0
    assert "shorter than 32 bytes" in result.stderr
    assert list(out.parent.iterdir()) == []
