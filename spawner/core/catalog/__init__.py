"""The catalog: teams, profiles, sharing defaults, declared GPUs and prices, validated.

A package by section: :mod:`.read` (``catalog_from_dict``, one reader for every
source) calls one reader per section, :mod:`.profiles`, :mod:`.teams`, :mod:`.sharing`
and :mod:`.inventory` (with prices), on the issue-collecting :mod:`.reader`;
:mod:`.kube_fields` checks a profile's Kubernetes scheduling fields. :mod:`.catalog`
holds the result, :mod:`.yaml_text` the YAML lines, :mod:`.write` the way back to plain
dicts. The names below are the public API; the modules import one another, never this
package.
"""

from .catalog import Catalog
from .inventory import DeviceSpec
from .read import catalog_from_dict
from .reader import CatalogError, ConfigIssue
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
