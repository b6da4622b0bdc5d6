"""The docs site (mkdocs.yml) shows every guide and documents every public name.

Cheap checks of the files only; CI builds the site itself with ``mkdocs build --strict``
(.ci/run), which fails on a broken link or a reference that does not resolve.
"""

import ast
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, which also reads the tags mkdocs configs may hold
    (``!!python/name:...``, ``!ENV``) as nothing instead of failing."""


_Loader.add_multi_constructor("", lambda loader, suffix, node: None)


def nav_pages(nav):
    """The Markdown files a mkdocs nav lists, at any depth (``- page.md``, ``- Title: page.md``,
    ``- Section: [...]``)."""
    for item in nav:
        values = item.values() if isinstance(item, dict) else [item]
        for value in values:
            if isinstance(value, list):
                yield from nav_pages(value)
            elif isinstance(value, str) and value.endswith(".md"):
                yield value


def test_the_nav_lists_every_page_in_docs_and_nothing_that_is_not_there():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)
    assert config["docs_dir"] == "docs"
    listed = list(nav_pages(config["nav"]))
    assert len(listed) == len(set(listed)), "a page is listed twice"
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    assert {"architecture.md", "migrating/README.md", "api/index.md"} <= pages
    assert sorted(pages - set(listed)) == [], "add these guides to the nav of mkdocs.yml"
    assert sorted(set(listed) - pages) == [], "the nav of mkdocs.yml lists missing files"


def exported_names(module: str) -> set[str]:
    """The names in ``__all__`` of a package's ``__init__.py``, read without importing it
    (``cadence``'s is made from its table of exports, ``_EXPORTS``, and ``_SUBMODULES``)."""
    path = ROOT / module.replace(".", "/") / "__init__.py"
    values = {target.id: node.value for node in ast.parse(path.read_text()).body
              if isinstance(node, ast.Assign) for target in node.targets
              if isinstance(target, ast.Name)}
    assert "__all__" in values, f"{path} has no __all__"
    try:
        return set(ast.literal_eval(values["__all__"]))
    except ValueError:
        tables = ("_EXPORTS", "_SUBMODULES")
        return {"__version__"}.union(*(ast.literal_eval(values[name]) for name in tables))


def test_the_api_reference_documents_every_public_name():
    directives = set(re.findall(r"^::: ([\w.]+)$", "\n".join(
        page.read_text() for page in sorted((DOCS / "api").glob("*.md"))), re.M))
    documented = {directive.rsplit(".", 1)[-1] for directive in directives}
    submodules = {"__version__", "callbacks", "core", "debug", "summary", "tensorpack"}
    public = (exported_names("cadence") - submodules) | exported_names("cadence.callbacks") \
        | exported_names("cadence.tensorpack") | exported_names("cadence.core")
    assert sorted(public - documented) == [], "add `::: cadence.<name>` to a page in docs/api/"


def test_the_kubernetes_manifests_of_the_slurm_guide_are_yaml_of_their_kinds():
    """docs/slurm.md's PyTorchJob and JobSet are not run anywhere (no Kubernetes here): they are
    at least well-formed, of the kind they say, and train with cadence."""
    blocks = re.findall(r"```yaml\n(.*?)```", (DOCS / "slurm.md").read_text(), re.S)
    manifests = [yaml.safe_load(block) for block in blocks]
    assert [(m["apiVersion"], m["kind"]) for m in manifests] == [
        ("kubeflow.org/v1", "PyTorchJob"), ("jobset.x-k8s.io/v1alpha2", "JobSet")]
    job, jobset = manifests
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert master["containers"][0]["command"][:3] == ["torchrun", "-m", "cadence"]
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"] == \
        job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "-m cadence train" in pod["containers"][0]["command"][-1]
