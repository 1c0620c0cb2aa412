"""The catalog's ``priority_class_names``: the cluster's PriorityClass per gpulab class, as
the Helm chart names them after its release; read strictly, written back unchanged."""

from __future__ import annotations

import pytest

from spawner.core import priority
from spawner.core.catalog import CatalogError, catalog_from_dict
from spawner.core.catalog.write import catalog_to_dict

BASE = {"teams": [{"name": "t", "guarantee": 1}], "profiles": [{"slug": "cpu", "display_name": "CPU", "gpus": 0}]}


def test_names_are_read_used_and_written_back():
    names = {"development": "staging-development", "over-quota": "staging-over-quota"}
    catalog = catalog_from_dict({**BASE, "priority_class_names": names})
    assert priority.cluster_priority_class_name(priority.DEVELOPMENT, catalog.priority_class_names) == (
        "staging-development"
    )
    assert priority.cluster_priority_class_name(priority.OVER_QUOTA, catalog.priority_class_names) == (
        "staging-over-quota"
    )
    # A class the chart did not name keeps gpulab's own name.
    assert priority.cluster_priority_class_name(priority.BATCH, catalog.priority_class_names) == "gpulab-batch"
    assert catalog_to_dict(catalog)["priority_class_names"] == names
    assert "priority_class_names" not in catalog_to_dict(catalog_from_dict(BASE))


@pytest.mark.parametrize(
    "value,words",
    [
        (["gpulab-batch"], "expected a mapping of gpulab class to PriorityClass name"),
        ({"interactive": "x"}, "unknown class 'interactive'"),
        ({"batch": "Not A Name"}, "expected a Kubernetes object name"),
        ({"batch": "a" * 64}, "expected a Kubernetes object name"),
        ({"batch": 7}, "expected a Kubernetes object name"),
    ],
)
def test_bad_names_are_refused_with_the_key(value, words):
    with pytest.raises(CatalogError) as e:
        catalog_from_dict({**BASE, "priority_class_names": value})
    assert words in str(e.value) and "priority_class_names" in str(e.value)
