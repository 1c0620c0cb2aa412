"""The spawn form's template compiled once (spawner/kube/form_template.py) renders what
KubeSpawner's own ``_render_options_form`` renders, without a cluster."""

from __future__ import annotations

import pytest
from kubespawner import KubeSpawner

from spawner.kube.form_template import form_template
from spawner.kube.spawner import GPUKubeSpawner
from tests.support.kube_spawner import kubeconfig_to_nowhere

PROFILES = [
    {"display_name": "Small", "slug": "small", "description": "2 CPUs <b>&</b>", "kubespawner_override": {}},
    {
        "display_name": "Big",
        "slug": "big",
        "default": True,
        "profile_options": {
            "image": {
                "display_name": "Image",
                "choices": {
                    "torch": {"display_name": "PyTorch", "default": True},
                    "base": {"display_name": "Base"},
                },
            }
        },
    },
]
#: A site's own form template (z2jh's singleuser.profileFormTemplate), including one of KubeSpawner's.
SITE_TEMPLATE = "<style>{% include 'style.css' %}</style>{% for p in profile_list %}<p>{{ p.display_name }}</p>{% endfor %}{{ profile_list|tojson }}"


@pytest.fixture
async def plain(tmp_path, monkeypatch) -> KubeSpawner:
    """A KubeSpawner as its own tests make one (``_mock``), its client pointed nowhere."""
    kubeconfig_to_nowhere(tmp_path, monkeypatch)
    return KubeSpawner(_mock=True)


@pytest.mark.parametrize("template", ["", SITE_TEMPLATE], ids=["kubespawner-form", "site-template"])
@pytest.mark.parametrize("options", [{}, {"profile": "small"}, {"profile": "gone"}])
async def test_the_cached_form_renders_what_kubespawner_renders(plain, template, options):
    plain.profile_form_template = template
    plain.user_options = options
    ours = GPUKubeSpawner._render_profile_form(plain, PROFILES)
    assert ours == KubeSpawner._render_options_form(plain, PROFILES)
    assert ours == GPUKubeSpawner._render_profile_form(plain, PROFILES)  # again, from the compiled one
    assert "Small" in ours and "Big" in ours


def test_each_template_text_is_compiled_once_per_search_path():
    first = form_template([], "a {{ 1 + 1 }}")
    assert form_template([], "a {{ 1 + 1 }}") is first
    assert form_template([], "b {{ 1 + 1 }}") is not first
    assert form_template(["/nonexistent"], "a {{ 1 + 1 }}") is not first
    assert first.render() == "a 2"
