# The brokers' identity. Invariant: the role can read and write Felix's objects under the
# bucket prefix, read the exact objects it boots from and the cluster secret (that one
# secret, by its ARN), and nothing else. No access key
# exists anywhere: felix's AWS SDK chain takes the role's credentials from instance
# metadata (IMDSv2) and refreshes them before they expire.

data "aws_iam_policy_document" "assume_ec2" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "broker" {
  name_prefix        = "${var.name}-broker-"
  description        = "Felix brokers of cluster ${var.name}: the segment bucket prefix only"
  assume_role_policy = data.aws_iam_policy_document.assume_ec2.json
  tags               = local.common_tags
}

resource "aws_iam_instance_profile" "broker" {
  name_prefix = "${var.name}-broker-"
  role        = aws_iam_role.broker.name
  tags        = local.common_tags
}

# The S3 calls felix makes (cold/src/store.rs): GET and HEAD (s3:GetObject), PUT and
# multipart parts (s3:PutObject), retention's DELETE (s3:DeleteObject), listings under the
# prefix (s3:ListBucket, for the reachability probe and a deleted stream's objects), and
# aborting or inspecting an interrupted multipart upload.
data "aws_iam_policy_document" "broker" {
  statement {
    sid = "SegmentObjects"
    actions = [
      "s3:GetObject",
      "s3:PutObject",
      "s3:DeleteObject",
      "s3:AbortMultipartUpload",
      "s3:ListMultipartUploadParts",
    ]
    resources = ["${aws_s3_bucket.segments.arn}/${var.object_prefix}/*"]
  }

  statement {
    sid       = "ListSegmentPrefix"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.segments.arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.object_prefix}/*"]
    }
  }

  dynamic "statement" {
    for_each = length(local.boot_object_arns) > 0 ? [1] : []
    content {
      sid       = "BootObjects"
      actions   = ["s3:GetObject"]
      resources = local.boot_object_arns
    }
  }

  # The cluster secret, fetched at boot by felix-fetch-secret (user data). With kms_key_arn
  # the secret is encrypted under that key, which SegmentBucketKey lets the role decrypt.
  statement {
    sid       = "ClusterSecret"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [aws_secretsmanager_secret.cluster.arn]
  }

  dynamic "statement" {
    for_each = var.kms_key_arn == null ? [] : [var.kms_key_arn]
    content {
      sid       = "SegmentBucketKey"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_role_policy" "broker" {
  name   = "felix-segments"
  role   = aws_iam_role.broker.id
  policy = data.aws_iam_policy_document.broker.json
}

resource "aws_iam_role_policy_attachment" "ssm" {
  count      = var.enable_ssm_session_manager ? 1 : 0
  role       = aws_iam_role.broker.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
}
