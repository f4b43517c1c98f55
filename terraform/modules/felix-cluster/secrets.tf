# The cluster secret: every request between brokers (Raft, replication, forwarded publishes,
# leases) is signed with it (docs/internal-network.md). Invariant: it is generated once,
# stored only encrypted (Secrets Manager, under kms_key_arn or the account's
# aws/secretsmanager key), readable by the brokers' role and nobody else this module
# creates, and fetched by each broker at boot into a 0600 file (never into user data).
# It is also in the Terraform state, like every generated secret: keep the state encrypted
# and private.

resource "random_password" "cluster_secret" {
  # 64 letters and digits: about 380 bits, well over felix's 32-byte minimum, and safe in a
  # file, a shell and JSON without quoting.
  length  = 64
  special = false
}

resource "aws_secretsmanager_secret" "cluster" {
  name_prefix = "${var.name}-cluster-secret-"
  description = "Felix cluster ${var.name}: the secret that authenticates brokers to each other (docs/internal-network.md)"
  # null: the account's AWS-managed key for Secrets Manager.
  kms_key_id              = var.kms_key_arn
  recovery_window_in_days = 7
  tags                    = local.common_tags
}

resource "aws_secretsmanager_secret_version" "cluster" {
  secret_id     = aws_secretsmanager_secret.cluster.id
  secret_string = random_password.cluster_secret.result
}
