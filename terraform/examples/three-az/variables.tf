variable "region" {
  type        = string
  default     = "us-east-1"
  description = "AWS region to deploy into. It needs three availability zones and the chosen instance type."
}

variable "availability_zones" {
  type        = list(string)
  default     = ["us-east-1a", "us-east-1b", "us-east-1c"]
  description = "Three availability zones of region, one broker subnet each. Change them with region."

  validation {
    condition     = length(var.availability_zones) == 3 && length(distinct(var.availability_zones)) == 3
    error_message = "availability_zones must name three distinct zones."
  }
}

variable "name" {
  type        = string
  default     = "felix-demo"
  description = "Cluster name: prefixes resource names (see the module's name variable)."
}

variable "vpc_cidr" {
  type        = string
  default     = "10.42.0.0/16"
  description = "CIDR block of the new VPC. Private broker subnets are its first three /20s, public subnets (NAT, internet-facing load balancer) three /24s from its upper half."

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0)) && endswith(var.vpc_cidr, "/16")
    error_message = "vpc_cidr must be a /16 CIDR block (e.g. 10.42.0.0/16)."
  }
}

variable "felix_binary_url" {
  type        = string
  description = "s3://bucket/key or https:// URL of a felix release binary for the instance architecture (e.g. `cargo build --release -p felix-gateway --bin felix`, uploaded with `aws s3 cp`)."
}

variable "felix_binary_sha256" {
  type        = string
  description = "SHA-256 of that binary (`sha256sum target/release/felix`)."
}

variable "instance_type" {
  type        = string
  default     = "i4i.xlarge"
  description = "Broker instance type with NVMe instance storage; sizing in docs/operations.md."
}

variable "architecture" {
  type        = string
  default     = "x86_64"
  description = "x86_64 or arm64, matching instance_type and the binary."
}

variable "broker_count" {
  type        = number
  default     = 3
  description = "Number of brokers (odd); one per availability zone at 3."
}

variable "client_cidrs" {
  type        = list(string)
  default     = null
  description = "Who may reach QUIC and Kafka. null: the VPC only."
}

variable "monitoring_cidrs" {
  type        = list(string)
  default     = null
  description = "Who may reach admin HTTP (metrics, /v1). null: the VPC only."
}

variable "enable_nlb" {
  type        = bool
  default     = false
  description = "Create the internal network load balancer (docs/operations.md: what it is for in a replicated cluster)."
}

variable "enable_nat_gateway" {
  type        = bool
  default     = true
  description = "One NAT gateway for outbound HTTPS (an https:// binary URL, Session Manager, package mirrors). S3 itself is reached through a gateway endpoint either way."
}
