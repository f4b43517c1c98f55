output "brokers" {
  description = "Each broker: node id, availability zone, private address, instance id."
  value = [
    for i, b in local.brokers : {
      node_id           = b.id
      availability_zone = b.availability_zone
      private_ip        = b.private_ip
      instance_id       = aws_instance.broker[i].id
    }
  ]
}

output "cluster" {
  description = "The cluster list every broker was started with (felix --cluster): 1=IP:PORT,2=IP:PORT,..."
  value       = local.cluster
}

output "quic_addresses" {
  description = "Each broker's QUIC address (felixctl --broker takes a comma-separated list)."
  value       = [for b in local.brokers : "${b.private_ip}:${var.quic_port}"]
}

output "kafka_bootstrap_servers" {
  description = "Kafka bootstrap.servers over the brokers' private addresses (give a client the first entry only until replication exists; see docs/operations.md)."
  value       = join(",", [for b in local.brokers : "${b.private_ip}:${var.kafka_port}"])
}

output "admin_urls" {
  description = "Each broker's admin HTTP base URL (/metrics, /healthz, /v1), reachable from monitoring_cidrs."
  value       = [for b in local.brokers : "http://${b.private_ip}:${var.admin_port}"]
}

output "metrics_targets" {
  description = "host:port of each broker's /metrics, for a Prometheus static_configs list."
  value       = [for b in local.brokers : "${b.private_ip}:${var.admin_port}"]
}

output "nlb_dns_name" {
  description = "DNS name of the load balancer, or null without enable_nlb."
  value       = var.enable_nlb ? aws_lb.this[0].dns_name : null
}

output "nlb_quic_address" {
  description = "QUIC address through the load balancer (host:port), or null."
  value       = var.enable_nlb ? "${aws_lb.this[0].dns_name}:${var.quic_port}" : null
}

output "nlb_kafka_bootstrap" {
  description = "Kafka bootstrap address through the load balancer (host:port), or null."
  value       = var.enable_nlb ? "${aws_lb.this[0].dns_name}:${var.kafka_port}" : null
}

output "bucket" {
  description = "Name of the segment bucket."
  value       = aws_s3_bucket.segments.bucket
}

output "object_store" {
  description = "The object_store setting of every broker: s3://bucket/prefix."
  value       = local.object_store
}

output "role_arn" {
  description = "ARN of the brokers' IAM role."
  value       = aws_iam_role.broker.arn
}

output "security_group_id" {
  description = "The brokers' security group (add rules for other clients here)."
  value       = aws_security_group.broker.id
}

output "felix_config" {
  description = "Each broker's rendered /etc/felix/felix.toml, by node id (check one with felix --config FILE --check-config)."
  value       = { for i, b in local.brokers : tostring(b.id) => local.felix_toml[i] }
}

output "cluster_secret_arn" {
  description = "ARN of the Secrets Manager secret holding the cluster secret (each broker reads it at boot into /etc/felix/cluster.secret; rotation: docs/internal-network.md)."
  value       = aws_secretsmanager_secret.cluster.arn
}
