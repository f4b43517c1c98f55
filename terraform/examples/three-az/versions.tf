terraform {
  required_version = ">= 1.5.0, < 2.0.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # Pinned to one minor series; `terraform init` writes the exact build to
      # .terraform.lock.hcl, which a real deployment commits.
      version = "~> 5.82.0"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.6.0"
    }
  }
}

provider "aws" {
  region = var.region

  default_tags {
    tags = {
      "felix:example" = "three-az"
    }
  }
}
