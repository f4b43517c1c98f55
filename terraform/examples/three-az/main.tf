# A new VPC across three availability zones and a Felix cluster in it: private subnets for
# the brokers (one per zone), public subnets for the NAT gateway and an internet-facing
# load balancer if one is wanted, and an S3 gateway endpoint so segment traffic stays off
# the NAT gateway.

# The zones are named, not taken from AWS's current list, so a zone added to or hidden
# from that list never moves a subnet (and with it a broker and its address).
data "aws_availability_zones" "selected" {
  state = "available"

  filter {
    name   = "zone-name"
    values = var.availability_zones
  }

  lifecycle {
    postcondition {
      condition     = length(self.names) == 3
      error_message = "availability_zones must name three available zones of var.region."
    }
  }
}

locals {
  # In the order given (the data source above only checks they exist).
  azs = var.availability_zones

  # Written out from the VPC CIDR, so the brokers' addresses are known at plan time.
  private_subnet_cidrs = [for i in range(3) : cidrsubnet(var.vpc_cidr, 4, i)]
  public_subnet_cidrs  = [for i in range(3) : cidrsubnet(var.vpc_cidr, 8, 128 + i)]

  client_cidrs     = var.client_cidrs != null ? var.client_cidrs : [var.vpc_cidr]
  monitoring_cidrs = var.monitoring_cidrs != null ? var.monitoring_cidrs : [var.vpc_cidr]
}

resource "aws_vpc" "this" {
  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true

  tags = { Name = var.name }
}

# The default security group of a new VPC allows all traffic between its members; nothing
# here uses it, so leave it with no rules.
resource "aws_default_security_group" "this" {
  vpc_id = aws_vpc.this.id
}

resource "aws_subnet" "private" {
  count = 3

  vpc_id            = aws_vpc.this.id
  cidr_block        = local.private_subnet_cidrs[count.index]
  availability_zone = local.azs[count.index]

  tags = { Name = "${var.name}-private-${local.azs[count.index]}" }
}

resource "aws_subnet" "public" {
  count = 3

  vpc_id                  = aws_vpc.this.id
  cidr_block              = local.public_subnet_cidrs[count.index]
  availability_zone       = local.azs[count.index]
  map_public_ip_on_launch = false

  tags = { Name = "${var.name}-public-${local.azs[count.index]}" }
}

resource "aws_internet_gateway" "this" {
  vpc_id = aws_vpc.this.id
  tags   = { Name = var.name }
}

resource "aws_route_table" "public" {
  vpc_id = aws_vpc.this.id
  tags   = { Name = "${var.name}-public" }
}

resource "aws_route" "public_internet" {
  route_table_id         = aws_route_table.public.id
  destination_cidr_block = "0.0.0.0/0"
  gateway_id             = aws_internet_gateway.this.id
}

resource "aws_route_table_association" "public" {
  count = 3

  subnet_id      = aws_subnet.public[count.index].id
  route_table_id = aws_route_table.public.id
}

resource "aws_eip" "nat" {
  count = var.enable_nat_gateway ? 1 : 0

  domain = "vpc"
  tags   = { Name = "${var.name}-nat" }
}

resource "aws_nat_gateway" "this" {
  count = var.enable_nat_gateway ? 1 : 0

  allocation_id = aws_eip.nat[0].id
  subnet_id     = aws_subnet.public[0].id
  tags          = { Name = var.name }

  depends_on = [aws_internet_gateway.this]
}

resource "aws_route_table" "private" {
  vpc_id = aws_vpc.this.id
  tags   = { Name = "${var.name}-private" }
}

resource "aws_route" "private_nat" {
  count = var.enable_nat_gateway ? 1 : 0

  route_table_id         = aws_route_table.private.id
  destination_cidr_block = "0.0.0.0/0"
  nat_gateway_id         = aws_nat_gateway.this[0].id
}

resource "aws_route_table_association" "private" {
  count = 3

  subnet_id      = aws_subnet.private[count.index].id
  route_table_id = aws_route_table.private.id
}

# S3 through a gateway endpoint: no NAT data charges for segments, and works without NAT.
resource "aws_vpc_endpoint" "s3" {
  vpc_id            = aws_vpc.this.id
  service_name      = "com.amazonaws.${var.region}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = [aws_route_table.private.id]

  tags = { Name = "${var.name}-s3" }
}

module "felix" {
  source = "../../modules/felix-cluster"

  name   = var.name
  vpc_id = aws_vpc.this.id
  subnets = [
    for i in range(3) : {
      id                = aws_subnet.private[i].id
      cidr_block        = local.private_subnet_cidrs[i]
      availability_zone = local.azs[i]
    }
  ]

  broker_count  = var.broker_count
  instance_type = var.instance_type
  architecture  = var.architecture

  felix_binary_url    = var.felix_binary_url
  felix_binary_sha256 = var.felix_binary_sha256

  client_cidrs     = local.client_cidrs
  monitoring_cidrs = local.monitoring_cidrs

  enable_nlb              = var.enable_nlb
  nlb_deletion_protection = false # an example is meant to be destroyed

  enable_ssm_session_manager = true

  # An example is meant to be destroyed; a real cluster keeps its history.
  bucket_force_destroy = true
}
