"""Every .tf file parses, and the template renderer the other tests rely on behaves like
Terraform's templatefile on the constructs it supports (and refuses the rest)."""

import hcl2
import pytest
from lark.exceptions import LarkError

from conftest import TERRAFORM, load, tf_files
from tftpl import TemplateError, render


def test_terraform_tree_has_the_module_and_the_example():
    names = {p.relative_to(TERRAFORM).as_posix() for p in tf_files()}
    for expected in (
        "modules/felix-cluster/main.tf",
        "modules/felix-cluster/variables.tf",
        "modules/felix-cluster/outputs.tf",
        "modules/felix-cluster/versions.tf",
        "examples/three-az/main.tf",
        "examples/three-az/versions.tf",
    ):
        assert expected in names


@pytest.mark.parametrize("path", tf_files(), ids=lambda p: p.relative_to(TERRAFORM).as_posix())
def test_every_tf_file_parses(path):
    doc = load(path)
    assert doc, f"{path} parsed to nothing"


def test_the_parser_refuses_a_missing_brace():
    # The syntax gate is only worth something if it rejects broken files.
    with pytest.raises((LarkError, ValueError)):
        hcl2.loads('resource "aws_s3_bucket" "b" {\n  bucket = "x"\n')


def test_renderer_strips_whitespace_like_terraform():
    # The example from Terraform's documentation of strip markers.
    src = "%{ for ip in ips ~}\nserver ${ip}\n%{ endfor ~}\n"
    assert render(src, {"ips": ["10.0.0.1", "10.0.0.2"]}) == "server 10.0.0.1\nserver 10.0.0.2\n"


def test_renderer_handles_escapes_if_else_and_maps():
    src = 'a=$${HOME} b=%%{x} %{ if on }yes%{ else }no%{ endif } %{ for k, v in m }${k}:${v};%{ endfor }'
    assert render(src, {"on": False, "m": {"b": 2, "a": 1}}) == "a=${HOME} b=%{x} no a:1;b:2;"
    assert render("%{ if !on }off%{ endif }", {"on": False}) == "off"
    assert render("${o.n} ${t}", {"o": {"n": 17179869184}, "t": True}) == "17179869184 true"


@pytest.mark.parametrize(
    "src,variables",
    [
        ("${upper(x)}", {"x": "a"}),  # function call
        ("${x[0]}", {"x": ["a"]}),  # indexing
        ("${missing}", {}),  # undefined variable
        ("${xs}", {"xs": ["a"]}),  # a list is not a string
        ("%{ if x }a", {"x": True}),  # unclosed
        ("%{ while x }a%{ endwhile }", {"x": True}),  # not a directive
    ],
)
def test_renderer_refuses_what_it_does_not_implement(src, variables):
    with pytest.raises(TemplateError):
        render(src, variables)
