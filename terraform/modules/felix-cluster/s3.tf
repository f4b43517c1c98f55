# The cold tier's bucket. Invariant: nothing but Felix deletes a current object under the
# prefix. Felix's retention first trims a shard's manifest through Raft and only then
# deletes the objects the trim released, so the manifest never names a missing object. A
# lifecycle expiration would delete objects the manifest still names (readers would get
# errors for history that retention promised to keep), and it cannot know which objects
# retention already released. The only lifecycle rule here therefore aborts incomplete
# multipart uploads (an upload interrupted by a crash leaves its parts billed but
# invisible) and, only when versioning is on, expires noncurrent versions, which no
# manifest ever names.

resource "aws_s3_bucket" "segments" {
  bucket        = var.bucket_name
  bucket_prefix = var.bucket_name == null ? "${var.name}-segments-" : null
  force_destroy = var.bucket_force_destroy

  tags = merge(local.common_tags, {
    Name = "${var.name}-segments"
  })
}

resource "aws_s3_bucket_public_access_block" "segments" {
  bucket = aws_s3_bucket.segments.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "segments" {
  bucket = aws_s3_bucket.segments.id

  rule {
    object_ownership = "BucketOwnerEnforced" # ACLs off: access is IAM and the bucket policy only
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "segments" {
  bucket = aws_s3_bucket.segments.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = var.kms_key_arn == null ? "AES256" : "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
    # With SSE-KMS, one data key per bucket instead of one KMS call per object.
    bucket_key_enabled = var.kms_key_arn != null
  }
}

# Versioning is off by default. Felix never needs an old version: a retried upload writes
# the same bytes to the same key, and retention deletes objects only once no manifest
# names them. With versioning on and no expiry of current objects allowed, every object
# retention deletes would stay as a noncurrent version, so storage would only grow; the
# noncurrent-version rule below bounds that when an operator turns versioning on to be able
# to recover from an accidental delete outside Felix.
resource "aws_s3_bucket_versioning" "segments" {
  bucket = aws_s3_bucket.segments.id

  versioning_configuration {
    # "Disabled" is only valid for a bucket that was never versioned; once turned on,
    # turning it off again means "Suspended".
    status = var.bucket_versioning ? "Enabled" : "Disabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "segments" {
  bucket = aws_s3_bucket.segments.id

  # One rule, and no expiration of current objects or transition in it: Felix's retention
  # deletes objects itself, after trimming the manifest, and cold reads need every named
  # object readable at once (an archive storage class would fail them).
  rule {
    id     = "felix-abort-incomplete-multipart-uploads"
    status = "Enabled"

    # The whole bucket: it is Felix's alone, and an abandoned upload is garbage anywhere.
    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }

    # Only with versioning: old versions of deleted objects, which no manifest names.
    dynamic "noncurrent_version_expiration" {
      for_each = var.bucket_versioning ? [var.noncurrent_version_days] : []
      content {
        noncurrent_days = noncurrent_version_expiration.value
      }
    }
  }

  depends_on = [aws_s3_bucket_versioning.segments]
}

# Refuse plain-HTTP requests to the bucket.
data "aws_iam_policy_document" "segments_bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.segments.arn,
      "${aws_s3_bucket.segments.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "segments" {
  bucket = aws_s3_bucket.segments.id
  policy = data.aws_iam_policy_document.segments_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.segments]
}
