# Who may reach which port. Invariant: the internal (Raft) port is open only between
# brokers (the group references itself); clients get QUIC and Kafka; admin HTTP, whose /v1
# API is unauthenticated, only the monitoring CIDRs and the load balancer's health checks.

resource "aws_security_group" "broker" {
  name_prefix = "${var.name}-broker-"
  description = "Felix brokers of cluster ${var.name}"
  vpc_id      = var.vpc_id

  tags = merge(local.common_tags, {
    Name = "${var.name}-broker"
  })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "quic" {
  for_each = toset(var.client_cidrs)

  security_group_id = aws_security_group.broker.id
  description       = "Felix QUIC clients"
  ip_protocol       = "udp"
  from_port         = var.quic_port
  to_port           = var.quic_port
  cidr_ipv4         = each.value
}

resource "aws_vpc_security_group_ingress_rule" "kafka" {
  for_each = toset(var.client_cidrs)

  security_group_id = aws_security_group.broker.id
  description       = "Kafka clients"
  ip_protocol       = "tcp"
  from_port         = var.kafka_port
  to_port           = var.kafka_port
  cidr_ipv4         = each.value
}

resource "aws_vpc_security_group_ingress_rule" "internal" {
  security_group_id            = aws_security_group.broker.id
  description                  = "Raft and internal RPCs between brokers only"
  ip_protocol                  = "tcp"
  from_port                    = var.internal_port
  to_port                      = var.internal_port
  referenced_security_group_id = aws_security_group.broker.id
}

resource "aws_vpc_security_group_ingress_rule" "admin" {
  for_each = toset(var.monitoring_cidrs)

  security_group_id = aws_security_group.broker.id
  description       = "Admin HTTP (metrics, healthz, v1 API) from monitoring"
  ip_protocol       = "tcp"
  from_port         = var.admin_port
  to_port           = var.admin_port
  cidr_ipv4         = each.value
}

# The load balancer health-checks GET /healthz on the admin port from its own addresses
# in its subnets. Keyed by position: subnet ids created in the same apply are unknown at
# plan time, and for_each keys must not be.
data "aws_subnet" "nlb" {
  for_each = var.enable_nlb && var.nlb_subnet_ids != null ? { for i, id in var.nlb_subnet_ids : tostring(i) => id } : {}
  id       = each.value
}

locals {
  nlb_health_check_cidrs = !var.enable_nlb ? [] : (
    var.nlb_subnet_ids == null ? [for s in var.subnets : s.cidr_block] : [for s in data.aws_subnet.nlb : s.cidr_block]
  )
}

resource "aws_vpc_security_group_ingress_rule" "admin_health_check" {
  for_each = { for i, cidr in local.nlb_health_check_cidrs : tostring(i) => cidr }

  security_group_id = aws_security_group.broker.id
  description       = "Load balancer health checks (GET /healthz)"
  ip_protocol       = "tcp"
  from_port         = var.admin_port
  to_port           = var.admin_port
  cidr_ipv4         = each.value
}

resource "aws_vpc_security_group_egress_rule" "https" {
  security_group_id = aws_security_group.broker.id
  description       = "HTTPS: S3 (segments, binary), the binary URL, SSM, package mirrors"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_vpc_security_group_egress_rule" "internal" {
  security_group_id            = aws_security_group.broker.id
  description                  = "Raft and internal RPCs to the other brokers"
  ip_protocol                  = "tcp"
  from_port                    = var.internal_port
  to_port                      = var.internal_port
  referenced_security_group_id = aws_security_group.broker.id
}
