output "cluster" {
  description = "The brokers' cluster list (node id = internal address)."
  value       = module.felix.cluster
}

output "brokers" {
  description = "Node id, availability zone, private address and instance id of each broker."
  value       = module.felix.brokers
}

output "quic_addresses" {
  description = "felixctl --broker value: every broker's QUIC address."
  value       = join(",", module.felix.quic_addresses)
}

output "kafka_bootstrap_servers" {
  description = "Kafka bootstrap.servers (give a client the first entry only until replication exists)."
  value       = module.felix.kafka_bootstrap_servers
}

output "nlb_quic_address" {
  description = "QUIC through the load balancer, when enabled."
  value       = module.felix.nlb_quic_address
}

output "nlb_kafka_bootstrap" {
  description = "Kafka bootstrap through the load balancer, when enabled."
  value       = module.felix.nlb_kafka_bootstrap
}

output "metrics_targets" {
  description = "Prometheus targets (host:port of /metrics)."
  value       = module.felix.metrics_targets
}

output "bucket" {
  description = "The segment bucket."
  value       = module.felix.bucket
}
