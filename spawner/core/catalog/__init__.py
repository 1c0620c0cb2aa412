"""The catalog: teams, profiles, sharing defaults, declared GPUs and prices, validated.

Start at :mod:`.read` (``catalog_from_dict``, one reader for every source); the YAML
lines live in :mod:`.yaml_text`, the way back to plain dicts in :mod:`.write`, and the
checks of a profile's Kubernetes scheduling fields in :mod:`.kube_fields`. The names
below are the catalog's public API; its modules import one another, never this package.
"""

from .read import Catalog, CatalogError, ConfigIssue, DeviceSpec, catalog_from_dict
from .write import catalog_to_dict
from .yaml_text import catalog_from_yaml

__all__ = [
    "Catalog",
    "CatalogError",
    "ConfigIssue",
    "DeviceSpec",
    "catalog_from_dict",
    "catalog_from_yaml",
    "catalog_to_dict",
]
