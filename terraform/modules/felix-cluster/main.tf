# The brokers: one EC2 instance per Raft member, each at a private address fixed by its
# index, so the cluster list is known before anything is created. Invariant: broker i has
# node id i + 1, subnet subnets[i % n], and that address for as long as the module exists;
# replacing an instance never changes who is who in the cluster list.

data "aws_partition" "current" {}
data "aws_region" "current" {}

data "aws_ssm_parameter" "al2023" {
  count = var.ami_id == null ? 1 : 0
  name  = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-${var.architecture}"
}

locals {
  # Where the NVMe volume is mounted and felix keeps its state (data_dir).
  data_dir = "/var/lib/felix"

  subnet_count = length(var.subnets)

  brokers = [
    for i in range(var.broker_count) : {
      id                = i + 1
      subnet_id         = var.subnets[i % local.subnet_count].id
      availability_zone = var.subnets[i % local.subnet_count].availability_zone
      private_ip        = cidrhost(var.subnets[i % local.subnet_count].cidr_block, var.broker_host_number + floor(i / local.subnet_count))
    }
  ]

  # The cluster list every broker gets (felix setting `cluster`): 1=IP:5100,2=IP:5100,...
  cluster_members = [for b in local.brokers : { id = b.id, address = "${b.private_ip}:${var.internal_port}" }]
  cluster         = join(",", [for m in local.cluster_members : "${m.id}=${m.address}"])

  object_store = "s3://${aws_s3_bucket.segments.bucket}/${var.object_prefix}"

  # Objects the instance reads at boot (an s3:// binary, the certificate and key), as exact
  # object ARNs, never a prefix. An https:// binary needs no permission.
  boot_objects = concat(
    startswith(var.felix_binary_url, "s3://") ? [var.felix_binary_url] : [],
    var.tls == null ? [] : [var.tls.cert_s3_uri, var.tls.key_s3_uri],
  )
  boot_object_arns = [for u in local.boot_objects : "arn:${data.aws_partition.current.partition}:s3:::${trimprefix(u, "s3://")}"]

  common_tags = merge(var.tags, {
    "felix:cluster" = var.name
  })
}

# The rendered configuration and boot script of each broker. terraform/tests/test_user_data.py
# renders the same templates with the same variables and runs `felix --check-config` on the
# result, so a key felix does not know cannot reach an instance.
locals {
  felix_toml = [
    for b in local.brokers : templatefile("${path.module}/templates/felix.toml.tftpl", {
      node_id           = b.id
      broker_count      = var.broker_count
      availability_zone = b.availability_zone
      cluster_members   = local.cluster_members
      data_dir          = local.data_dir
      quic_port         = var.quic_port
      admin_port        = var.admin_port
      internal_port     = var.internal_port
      kafka_port        = var.kafka_port
      object_store      = local.object_store
      s3_region         = data.aws_region.current.name
      fsync             = var.fsync
      cache_disk_bytes  = var.cache_disk_bytes
      tls_enabled       = var.tls != null
    })
  ]

  felix_service = templatefile("${path.module}/templates/felix.service.tftpl", {
    data_dir     = local.data_dir
    memory_max   = var.memory_max
    nofile_limit = var.nofile_limit
  })

  user_data = [
    for i, b in local.brokers : templatefile("${path.module}/templates/user-data.yaml.tftpl", {
      node_id             = b.id
      data_dir            = local.data_dir
      felix_toml_b64      = base64encode(local.felix_toml[i])
      felix_service_b64   = base64encode(local.felix_service)
      felix_binary_url    = var.felix_binary_url
      felix_binary_sha256 = var.felix_binary_sha256
      tls_cert_s3_uri     = var.tls == null ? "" : var.tls.cert_s3_uri
      tls_key_s3_uri      = var.tls == null ? "" : var.tls.key_s3_uri
      cluster_secret_arn  = aws_secretsmanager_secret.cluster.arn
      region              = data.aws_region.current.name
    })
  ]
}

resource "aws_instance" "broker" {
  count = var.broker_count

  ami                         = var.ami_id != null ? var.ami_id : nonsensitive(data.aws_ssm_parameter.al2023[0].value)
  instance_type               = var.instance_type
  subnet_id                   = local.brokers[count.index].subnet_id
  private_ip                  = local.brokers[count.index].private_ip
  vpc_security_group_ids      = [aws_security_group.broker.id]
  iam_instance_profile        = aws_iam_instance_profile.broker.name
  associate_public_ip_address = false
  ebs_optimized               = true
  monitoring                  = true
  user_data                   = local.user_data[count.index]

  # The secret must exist before a broker boots and fetches it.
  depends_on = [aws_secretsmanager_secret_version.cluster]

  # Instance storage is wiped by stop/start: an in-place update that stops the instance
  # (a user_data change does) would wipe every broker at once. User data and AMI changes
  # therefore never touch running brokers; replace them one at a time instead
  # (docs/operations.md, Upgrading).
  user_data_replace_on_change = false

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required" # IMDSv2 only; the AWS SDK chain in felix uses it
    http_put_response_hop_limit = 1
  }

  root_block_device {
    volume_type           = "gp3"
    volume_size           = var.root_volume_size_gb
    encrypted             = true
    delete_on_termination = true
  }

  # Spread over distinct hardware within each zone too.
  placement_group = aws_placement_group.brokers.id

  tags = merge(local.common_tags, {
    Name            = "${var.name}-broker-${local.brokers[count.index].id}"
    "felix:node-id" = tostring(local.brokers[count.index].id)
    "felix:az"      = local.brokers[count.index].availability_zone
    "felix:role"    = "broker"
  })

  lifecycle {
    ignore_changes = [ami, user_data]

    precondition {
      condition     = length(distinct([for b in local.brokers : b.private_ip])) == length(local.brokers)
      error_message = "Two brokers would get the same private address; check subnets and broker_host_number."
    }

    precondition {
      # A spread placement group holds at most 7 running instances per availability zone.
      condition     = ceil(var.broker_count / local.subnet_count) <= 7
      error_message = "More than 7 brokers in one availability zone: give more subnets."
    }
  }
}

resource "aws_placement_group" "brokers" {
  name     = "${var.name}-brokers"
  strategy = "spread"
  tags     = local.common_tags
}
