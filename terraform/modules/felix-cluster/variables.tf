# Inputs of the felix-cluster module. Every variable has a type and a description
# (terraform/tests/test_structure.py checks it); validations refuse at plan time what
# would otherwise surface as a broker that never starts.

# --- Placement ----------------------------------------------------------------------------

variable "name" {
  type        = string
  description = "Name of this cluster: prefixes every resource name and tag (lowercase letters, digits and hyphens, 2-24 characters)."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,23}$", var.name))
    error_message = "name must be 2-24 characters of lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "vpc_id" {
  type        = string
  description = "ID of the VPC the brokers run in."

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must look like vpc-0123abcd."
  }
}

variable "subnets" {
  type = list(object({
    id                = string
    cidr_block        = string
    availability_zone = string
  }))
  description = "Private subnets for the brokers, one per availability zone. Broker i (node id i+1) goes to subnets[i % length(subnets)]. cidr_block is passed in (not looked up) so the brokers' addresses, and with them the cluster list, are known at plan time."

  validation {
    condition     = length(var.subnets) >= 1
    error_message = "subnets needs at least one subnet (three, in three availability zones, for a cluster that survives losing a zone)."
  }

  validation {
    condition     = alltrue([for s in var.subnets : can(regex("^subnet-[0-9a-f]+$", s.id)) && can(cidrhost(s.cidr_block, 0))])
    error_message = "Each subnet needs an id like subnet-0123abcd and a cidr_block like 10.0.1.0/24."
  }

  validation {
    condition     = length(distinct([for s in var.subnets : s.availability_zone])) == length(var.subnets)
    error_message = "Give one subnet per availability zone: two subnets in one zone put two Raft voters in one failure domain."
  }
}

variable "broker_count" {
  type        = number
  default     = 3
  description = "Number of brokers. Each is a voting member of the Raft control plane, so the count is odd: 3 survives one lost broker, 5 survives two."

  validation {
    condition     = var.broker_count >= 1 && var.broker_count <= 9 && var.broker_count % 2 == 1 && floor(var.broker_count) == var.broker_count
    error_message = "broker_count must be an odd whole number from 1 to 9 (an even count tolerates no more failures than the odd count below it)."
  }
}

variable "broker_host_number" {
  type        = number
  default     = 10
  description = "Host number of the first broker's private address in its subnet (cidrhost). Broker i gets host number broker_host_number + floor(i / length(subnets)) in its subnet, so addresses stay fixed across instance replacement. Keep the range free of other ENIs."

  validation {
    # AWS reserves the first four addresses of every subnet.
    condition     = var.broker_host_number >= 4 && floor(var.broker_host_number) == var.broker_host_number
    error_message = "broker_host_number must be a whole number of at least 4 (AWS reserves .0 to .3 of each subnet)."
  }
}

# --- Instances ----------------------------------------------------------------------------

variable "instance_type" {
  type        = string
  default     = "i4i.xlarge"
  description = "EC2 instance type. It must have NVMe instance storage (the hot tier): i4i, i4g, im4gn, is4gen, i3, i3en, i7ie, i8g, or a 'd' type such as m6id, c6gd, r7gd. Sizing: docs/operations.md."

  validation {
    condition     = can(regex("^(i3|i3en|i4i|i4g|i7i|i7ie|i8g|i8ge|im4gn|is4gen|[cmrxz][5-8][a-z]*d[a-z]*)\\.[0-9a-z]+$", var.instance_type))
    error_message = "instance_type must be a type with NVMe instance storage (e.g. i4i.xlarge, im4gn.large, m6id.xlarge)."
  }
}

variable "architecture" {
  type        = string
  default     = "x86_64"
  description = "CPU architecture of instance_type and of the felix binary: x86_64 (i4i, i3en, m6id...) or arm64 (i4g, im4gn, is4gen, c6gd...)."

  validation {
    condition     = contains(["x86_64", "arm64"], var.architecture)
    error_message = "architecture must be x86_64 or arm64."
  }
}

variable "ami_id" {
  type        = string
  default     = null
  description = "AMI for the brokers. null: the latest Amazon Linux 2023 for architecture, looked up in SSM when the instance is created (later AMI releases do not replace running brokers; see docs/operations.md, Upgrading)."

  validation {
    condition     = var.ami_id == null || can(regex("^ami-[0-9a-f]+$", var.ami_id))
    error_message = "ami_id must be null or look like ami-0123abcd."
  }
}

variable "root_volume_size_gb" {
  type        = number
  default     = 30
  description = "Size of each broker's encrypted gp3 root volume in GiB (OS, binary, logs; the data lives on instance storage)."

  validation {
    condition     = var.root_volume_size_gb >= 8 && var.root_volume_size_gb <= 1024
    error_message = "root_volume_size_gb must be between 8 and 1024."
  }
}

variable "enable_ssm_session_manager" {
  type        = bool
  default     = false
  description = "Attach AWS's AmazonSSMManagedInstanceCore policy so operators can open shells (Session Manager) for upgrades and repairs without SSH. It is AWS's managed policy, separate from the module's bucket policy."
}

# --- The felix binary and its configuration -----------------------------------------------

variable "felix_binary_url" {
  type        = string
  description = "Where each broker downloads the felix binary at boot: s3://bucket/key (read with the instance role, which is granted s3:GetObject on exactly this object) or https://... A release build for architecture; nothing is built on the instance."

  validation {
    condition     = can(regex("^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/|https://)[^*?'\"\\s]+$", var.felix_binary_url))
    error_message = "felix_binary_url must be s3://bucket/key or https://host/path (no wildcards, quotes or spaces)."
  }
}

variable "felix_binary_sha256" {
  type        = string
  description = "SHA-256 of the felix binary (64 hex digits). The instance refuses a download that does not match, so a truncated or replaced object never runs."

  validation {
    condition     = can(regex("^[0-9a-f]{64}$", var.felix_binary_sha256))
    error_message = "felix_binary_sha256 must be 64 lowercase hex digits (sha256sum output)."
  }
}

variable "tls" {
  type = object({
    cert_s3_uri = string
    key_s3_uri  = string
  })
  default     = null
  description = "Optional certificate (PEM chain, leaf first) and key for the QUIC listener, as s3://bucket/key objects the instance role may read (exactly these two). null: each broker generates its own CA and certificate under <data_dir>/tls on first start (clients then need that broker's ca.pem; docs/operations.md)."

  validation {
    condition     = var.tls == null ? true : alltrue([for u in [var.tls.cert_s3_uri, var.tls.key_s3_uri] : can(regex("^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[^*?'\"\\s]+$", u))])
    error_message = "tls.cert_s3_uri and tls.key_s3_uri must be s3://bucket/key (no wildcards)."
  }
}

variable "fsync" {
  type        = string
  default     = "periodic"
  description = "Shard-log fsync policy (felix setting fsync): periodic, periodic:MS or on_commit. What each survives: docs/durability.md."

  validation {
    condition     = can(regex("^(periodic|periodic:[1-9][0-9]*|on_commit)$", var.fsync))
    error_message = "fsync must be periodic, periodic:MS (MS > 0) or on_commit."
  }
}

variable "cache_disk_bytes" {
  type        = number
  default     = 17179869184
  description = "Disk tier of the cold-read cache on the NVMe volume (felix setting cache_disk_bytes), in bytes. Default 16 GiB; 0 keeps the cache in memory only."

  validation {
    condition     = var.cache_disk_bytes >= 0 && floor(var.cache_disk_bytes) == var.cache_disk_bytes
    error_message = "cache_disk_bytes must be a whole number of bytes, 0 or more."
  }
}

variable "memory_max" {
  type        = string
  default     = "85%"
  description = "systemd MemoryMax of the felix service: a percentage of the instance's memory or a size (e.g. 12G). The kernel kills felix above it and systemd restarts it, instead of the whole instance swapping or the OOM killer choosing."

  validation {
    condition     = can(regex("^([1-9][0-9]?%|100%|[1-9][0-9]*[KMGT]?)$", var.memory_max))
    error_message = "memory_max must be a percentage (1%-100%) or a size like 12G."
  }
}

variable "nofile_limit" {
  type        = number
  default     = 1048576
  description = "systemd LimitNOFILE of the felix service: open files (segment files, indexes, sockets)."

  validation {
    condition     = var.nofile_limit >= 65536
    error_message = "nofile_limit must be at least 65536."
  }
}

# --- Ports and who may reach them ---------------------------------------------------------

variable "quic_port" {
  type        = number
  default     = 5000
  description = "UDP port of the QUIC client listener (felix quic_addr)."

  validation {
    condition     = var.quic_port >= 1024 && var.quic_port <= 65535
    error_message = "quic_port must be between 1024 and 65535."
  }
}

variable "kafka_port" {
  type        = number
  default     = 9092
  description = "TCP port of the Kafka listener (kafka_addr). Opened in the security group and the load balancer."

  validation {
    condition     = var.kafka_port >= 1024 && var.kafka_port <= 65535
    error_message = "kafka_port must be between 1024 and 65535."
  }
}

variable "internal_port" {
  type        = number
  default     = 5100
  description = "TCP port of the control plane's internal HTTP (Raft RPCs, forwarded proposals; felix internal_addr and the cluster list). Reachable only from the other brokers."

  validation {
    condition     = var.internal_port >= 1024 && var.internal_port <= 65535
    error_message = "internal_port must be between 1024 and 65535."
  }
}

variable "admin_port" {
  type        = number
  default     = 8080
  description = "TCP port of admin HTTP (felix admin_addr): /metrics, /healthz and the unauthenticated /v1 management API. Reachable only from monitoring_cidrs (and the load balancer's health checks)."

  validation {
    condition     = var.admin_port >= 1024 && var.admin_port <= 65535
    error_message = "admin_port must be between 1024 and 65535."
  }
}

variable "client_cidrs" {
  type        = list(string)
  description = "CIDR blocks of clients allowed to reach QUIC (UDP quic_port) and Kafka (TCP kafka_port)."

  validation {
    condition     = length(var.client_cidrs) > 0 && alltrue([for c in var.client_cidrs : can(cidrhost(c, 0))])
    error_message = "client_cidrs must be a non-empty list of CIDR blocks."
  }
}

variable "monitoring_cidrs" {
  type        = list(string)
  description = "CIDR blocks allowed to reach admin HTTP (TCP admin_port): Prometheus and operators. The /v1 API there can create and delete streams, so keep this narrow."

  validation {
    condition     = length(var.monitoring_cidrs) > 0 && alltrue([for c in var.monitoring_cidrs : can(cidrhost(c, 0)) && c != "0.0.0.0/0"])
    error_message = "monitoring_cidrs must be a non-empty list of CIDR blocks, not 0.0.0.0/0."
  }
}

# --- The cold tier ------------------------------------------------------------------------

variable "bucket_name" {
  type        = string
  default     = null
  description = "Name of the S3 bucket the module creates for sealed segments. null: a unique name starting with '<name>-segments-'."

  validation {
    condition     = var.bucket_name == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be a valid S3 bucket name."
  }
}

variable "object_prefix" {
  type        = string
  default     = "felix"
  description = "Key prefix of Felix's objects in the bucket (object_store = s3://bucket/<object_prefix>). The instance role may touch nothing outside it."

  validation {
    # No '*' or '?': the prefix is written into IAM resource ARNs, where they are wildcards.
    condition     = can(regex("^[a-z0-9][a-z0-9._=-]*(/[a-z0-9][a-z0-9._=-]*)*$", var.object_prefix))
    error_message = "object_prefix must be one or more path segments of lowercase letters, digits, '.', '_', '=' or '-', without leading or trailing '/'."
  }
}

variable "bucket_versioning" {
  type        = bool
  default     = false
  description = "Enable S3 versioning on the segment bucket. Off by default: Felix never rewrites an object with different bytes and its retention deletes objects itself, so versions only keep deleted data (and its cost) around. On: deleted or overwritten objects stay recoverable, and a rule expires noncurrent versions after noncurrent_version_days. See docs/operations.md."
}

variable "noncurrent_version_days" {
  type        = number
  default     = 30
  description = "With bucket_versioning: days a noncurrent (deleted or overwritten) version is kept. Never touches current objects."

  validation {
    condition     = var.noncurrent_version_days >= 1
    error_message = "noncurrent_version_days must be at least 1."
  }
}

variable "kms_key_arn" {
  type        = string
  default     = null
  description = "KMS key for the bucket's default encryption (SSE-KMS with a bucket key). null: SSE-S3 (AES-256). With a key, the instance role gets kms:Decrypt and kms:GenerateDataKey on that key only."

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[0-9a-f-]+$", var.kms_key_arn))
    error_message = "kms_key_arn must be null or a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/ID)."
  }
}

variable "bucket_force_destroy" {
  type        = bool
  default     = false
  description = "Let terraform destroy delete the bucket with its objects. Keep false outside experiments: the objects are the streams' history."
}

# --- Load balancer ------------------------------------------------------------------------

variable "enable_nlb" {
  type        = bool
  default     = false
  description = "Create a network load balancer with a UDP listener for QUIC and a TCP listener for Kafka. Any broker accepts a publish (a non-leader forwards it to the shard's leader); subscriptions and Kafka fetches go to each shard's leader, which ClusterClient and Kafka clients find themselves (docs/replication.md). Off by default: clients that take the broker list need no load balancer."
}

variable "nlb_internal" {
  type        = bool
  default     = true
  description = "Whether the load balancer is internal (reachable only inside the VPC). An internet-facing one needs public subnets, passed as nlb_subnet_ids."
}

variable "nlb_subnet_ids" {
  type        = list(string)
  default     = null
  description = "Subnets of the load balancer. null: the broker subnets."

  validation {
    condition     = var.nlb_subnet_ids == null ? true : alltrue([for s in var.nlb_subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "nlb_subnet_ids must be subnet ids like subnet-0123abcd."
  }
}

variable "nlb_deletion_protection" {
  type        = bool
  default     = true
  description = "Deletion protection of the load balancer (turn off before terraform destroy)."
}

variable "tags" {
  type        = map(string)
  default     = {}
  description = "Tags added to every resource the module creates."
}
