terraform {
  # optional() object attributes with defaults need 1.3; templatefile's %{ if } needs 0.12.
  required_version = ">= 1.5.0, < 2.0.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # A module states the range it works with; the root module (examples/three-az) pins
      # the exact minor series and its lock file pins the build.
      version = ">= 5.40.0, < 6.0.0"
    }
    random = {
      # The cluster secret (secrets.tf).
      source  = "hashicorp/random"
      version = ">= 3.5.0, < 4.0.0"
    }
  }
}
