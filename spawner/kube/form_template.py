"""The spawn form's Jinja template, compiled once.

KubeSpawner's ``_render_options_form`` builds a new Jinja ``Environment`` and compiles
``profile_form_template`` (and the ``style.css`` it includes) on every render: measured
on the test bed (benchmarks/kube_scale.py ``--profile-page``), compiling was 86 % of the
spawn page's time. The environment here is KubeSpawner's (its loaders: the admin's
``additional_profile_form_template_paths``, then KubeSpawner's own templates; ``tojson``
keeping the profiles' order), kept per set of paths, and each template text is
compiled once.
"""

from __future__ import annotations

from collections.abc import Sequence

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PackageLoader, Template

#: Environments by template search paths, and compiled templates by (paths, text).
_ENVIRONMENTS: dict[tuple[str, ...], Environment] = {}
_TEMPLATES: dict[tuple[tuple[str, ...], str], Template] = {}


def form_template(paths: Sequence[str], text: str) -> Template:
    """The compiled form template: ``text``, or KubeSpawner's ``form.html`` when empty."""
    key = tuple(paths)
    template = _TEMPLATES.get((key, text))
    if template is not None:
        return template
    env = _ENVIRONMENTS.get(key)
    if env is None:
        env = Environment(loader=ChoiceLoader([FileSystemLoader(list(key)), PackageLoader("kubespawner", "templates")]))
        env.policies["json.dumps_kwargs"] = {"sort_keys": False}  # the admin's profile order, as KubeSpawner
        _ENVIRONMENTS[key] = env
    template = env.from_string(text) if text else env.get_template("form.html")
    _TEMPLATES[(key, text)] = template
    return template
