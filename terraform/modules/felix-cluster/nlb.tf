# Optional network load balancer: one address for QUIC (UDP) and Kafka (TCP) bootstrap.
# Targets are health-checked with GET /healthz on the admin port (200 once the broker is
# ready), the one signal felix already serves for every listener.
# Client addresses are preserved, so the broker security group's client CIDRs still apply.

locals {
  nlb_subnet_ids = var.nlb_subnet_ids != null ? var.nlb_subnet_ids : [for s in var.subnets : s.id]

  nlb_listeners = {
    quic  = { protocol = "UDP", port = var.quic_port }
    kafka = { protocol = "TCP", port = var.kafka_port }
  }

  nlb_attachments = var.enable_nlb ? {
    for pair in setproduct(keys(local.nlb_listeners), range(var.broker_count)) :
    "${pair[0]}-${pair[1] + 1}" => { listener = pair[0], index = pair[1] }
  } : {}
}

resource "aws_lb" "this" {
  count = var.enable_nlb ? 1 : 0

  name_prefix                      = substr(var.name, 0, 6)
  load_balancer_type               = "network"
  internal                         = var.nlb_internal
  subnets                          = local.nlb_subnet_ids
  enable_cross_zone_load_balancing = true
  enable_deletion_protection       = var.nlb_deletion_protection

  tags = merge(local.common_tags, {
    Name = "${var.name}-nlb"
  })
}

resource "aws_lb_target_group" "this" {
  for_each = var.enable_nlb ? local.nlb_listeners : {}

  name_prefix          = substr("${each.key}-", 0, 6)
  port                 = each.value.port
  protocol             = each.value.protocol
  vpc_id               = var.vpc_id
  target_type          = "instance"
  preserve_client_ip   = true
  deregistration_delay = 30

  health_check {
    protocol            = "HTTP"
    port                = tostring(var.admin_port)
    path                = "/healthz"
    matcher             = "200"
    interval            = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  tags = merge(local.common_tags, {
    Name = "${var.name}-${each.key}"
  })
}

resource "aws_lb_listener" "this" {
  for_each = var.enable_nlb ? local.nlb_listeners : {}

  load_balancer_arn = aws_lb.this[0].arn
  port              = each.value.port
  protocol          = each.value.protocol

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.this[each.key].arn
  }

  tags = local.common_tags
}

resource "aws_lb_target_group_attachment" "this" {
  for_each = local.nlb_attachments

  target_group_arn = aws_lb_target_group.this[each.value.listener].arn
  target_id        = aws_instance.broker[each.value.index].id
  port             = local.nlb_listeners[each.value.listener].port
}
